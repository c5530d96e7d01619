"""Work for the database thread, gathered while it is busy and done in one hop.

Daphne's ORM work runs in one thread (Channels' `database_sync_to_async`). Besides
its SQL, each hop costs the event loop and the thread CPU of its own: a future, a
copied context, the executor's queue, closing stale connections, a wake-up of the
loop. Under load, calls come faster than the thread serves them. A HopBatch then
hands everything that came in during one hop to the next, in the order it came, and
each item gets its own result or exception. Its runner may also write the batch in
one transaction (one commit for many rows), or share a read between the items
(docs/design.md, "Batched hops"). With one call at a time, a batch is that call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from channels.db import database_sync_to_async

Item = TypeVar("Item")
Result = TypeVar("Result")

# What a runner returns for each item, in order: its result, or the exception it raised.
Runner = Callable[[Sequence[Item]], list[Result | Exception]]

# Items per hop: a cancel queued behind a hop waits for all of it.
MOST_PER_HOP = 32


class HopBatch(Generic[Item, Result]):
    """One queue of items for the database thread, and the runner that does a batch."""

    def __init__(self, runner: Runner[Item, Result], *, most: int = MOST_PER_HOP) -> None:
        self._runner = runner
        self._most = most
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._draining: asyncio.Task[None] | None = None

    def submit(self, item: Item) -> asyncio.Future[Result]:
        """Queue the item (from the event loop, in order); its result once its hop is done.

        The item is done even if the future is cancelled meanwhile, as a thread's work
        goes on when its awaiter stops waiting.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): nothing carries over
            self._loop, self._waiting, self._draining = loop, [], None
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.append((item, future))
        if self._draining is None:
            self._draining = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self._most], self._waiting[self._most :]
                items = [item for item, _ in batch]
                try:
                    outcomes = await database_sync_to_async(self._runner)(items)
                except Exception as exc:  # the runner itself failed: so did its items
                    outcomes = [exc] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
                batch = []
        finally:
            self._draining = None
            # Cancelled with its loop: nobody waits for an answer any more.
            for _, future in (*batch, *self._waiting):
                future.cancel()


def run_each(items: Sequence[Item], do: Callable[[Item], Result]) -> list[Result | Exception]:
    """Each item in turn; an exception is that item's alone."""
    outcomes: list[Result | Exception] = []
    for item in items:
        try:
            outcomes.append(do(item))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes
