"""A session's calls written in the order they were sent, while several start at once.

A connection reads its next call while the calls before it are still starting (the
rate limiter's answer, the schema, the database thread): a burst of calls keeps
the database thread busy instead of waiting on each round trip in turn. Each start
takes a turn when its frame is read, and queues its row for the database thread
only after the start before it has queued its own. Rows are written first in, first
out (calls/job_writes.py), so the calls start in the order they came.
"""

from __future__ import annotations

import asyncio


class StartOrder:
    """One connection's turns, in the order its calls were read."""

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def turn(self) -> StartTurn:
        """The next call's turn (from the event loop, as its frame is read)."""
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn = StartTurn(self._last, mine)
        self._last = mine
        return turn


class StartTurn:
    """One start's place: after the one before it, before the one after it."""

    def __init__(self, previous: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        self._previous = previous
        self._mine = mine

    async def come(self) -> None:
        """Return once the start before this one has handed its row over (or given up)."""
        if self._previous is not None and not self._previous.done():
            # Not `await previous`: cancelling this start must not cancel that one's.
            await asyncio.wait({self._previous})

    def pass_on(self) -> None:
        """This start has handed its row over, or will not: the next one may go."""
        if not self._mine.done():
            self._mine.set_result(None)
