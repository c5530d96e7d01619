"""Work no reply waits for (a revoke, bookkeeping), kept referenced until it ends.

And work that must finish whoever stops waiting for it (`unstoppable`, `waited`):
a row being written when its caller is cancelled, a cancel's settle and flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


class Background:
    """Coroutines no reply waits for; kept referenced until they end, drained at the end."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()

    def run(self, work: Awaitable[T]) -> asyncio.Future[T]:
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def drain(self) -> None:
        """Return once nothing runs, including what the work ran meanwhile started."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


# Tasks a cancel of their caller must not cut short (asyncio keeps only weak refs).
_UNSTOPPABLE = Background()


def unstoppable(work: Awaitable[T]) -> asyncio.Future[T]:
    """`work` as a task of its own: a cancel of whoever waits for it does not cut it short."""
    return _UNSTOPPABLE.run(work)


async def waited(task: asyncio.Future[T]) -> T:
    """Wait for `task`; a cancel of the caller (anyio's, deferred; asyncio's) leaves it running.

    anyio's shield alone lets a plain asyncio cancel (Daphne's) through; asyncio's
    shield alone would cut the wait at anyio's: both, so the task always goes on.
    """
    with anyio.CancelScope(shield=True):
        await asyncio.shield(task)
    return task.result()
