"""Calls being started off the consumer's lock, and what must wait for them.

Writing a call's job and handing it to Celery takes a few milliseconds. The
consumer does it in a task of its own so that a cancel sent right behind the call
is read at once (capabilities/calls/start_ticket.py). Every other frame waits
until no start is pending, and a note about a call until its start is reported, so
the session sees them in the order they came.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from capabilities.calls.start_ticket import StartTicket

logger = logging.getLogger(__name__)

Work = Coroutine[Any, Any, None]


class CallStarts:
    """One connection's calls being started."""

    def __init__(self) -> None:
        self._starts: dict[str, tuple[StartTicket, asyncio.Task[None]]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        # Cancels waiting for their call's start: a later cancel waits for them.
        self._deferred: set[asyncio.Task[None]] = set()

    def begin(self, call_id: str, start: Callable[[StartTicket], Work]) -> None:
        """Run `start(ticket)` for this call; it reports its outcome itself."""
        ticket = StartTicket()
        task = self._spawn(start(ticket))
        self._starts[call_id] = (ticket, task)
        task.add_done_callback(lambda _: self._forget(call_id, task))

    def starting(self, call_id: str | None) -> bool:
        """Whether a call with this callId is being started (its start not reported yet)."""
        return call_id is not None and call_id in self._starts

    def cancel(self, call_id: str, reason: str) -> bool:
        """Cancel the call before its job is written; False if too late (or not starting)."""
        entry = self._starts.get(call_id)
        return entry is not None and entry[0].cancel(reason)

    def after(self, call_id: str, work: Work) -> None:
        """Run `work` (a cancel) once the call's start has been reported."""
        entry = self._starts.get(call_id)
        task = self._spawn(_after(entry[1] if entry is not None else None, work))
        self._deferred.add(task)
        task.add_done_callback(self._deferred.discard)

    async def deferred(self) -> None:
        """Return once no cancel waits for its call's start: cancels stay in the order sent.

        A cancel overtakes starts, never an earlier cancel: otherwise a cancel of a
        running call could free the agent's share (and the dispatcher start a waiting
        call) before an earlier cancel of that waiting call, or answer for a call an
        earlier cancel is about to cancel.
        """
        while self._deferred:
            await asyncio.wait(set(self._deferred))

    async def written_if_cancelled(self, call_id: str) -> None:
        """Return once a call cancelled before its row has that row written (else at once).

        Its session answered it already and let it go: another cancel of it looks
        the call up in the database, which must then find it.
        """
        entry = self._starts.get(call_id)
        if entry is not None and entry[0].cancelled:
            await asyncio.wait({entry[1]})

    async def settled(self) -> None:
        """Return once no start (nor anything waiting on one) is pending."""
        while self._pending:
            await asyncio.wait(set(self._pending))

    async def reported(self, call_id: str) -> None:
        """Return once this call is not being started (at once if it is not)."""
        entry = self._starts.get(call_id)
        if entry is not None:
            await asyncio.wait({entry[1]})

    def _spawn(self, work: Work) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("A call's start failed", exc_info=task.exception())

    def _forget(self, call_id: str, task: asyncio.Task[None]) -> None:
        entry = self._starts.get(call_id)
        if entry is not None and entry[1] is task:
            del self._starts[call_id]


async def _after(start: asyncio.Task[None] | None, work: Work) -> None:
    if start is not None:
        await asyncio.wait({start})
    await work
