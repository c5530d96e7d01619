"""Work no reply waits for (a revoke, bookkeeping), kept referenced until it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class Background:
    """Coroutines no reply waits for; kept referenced until they end, drained at the end."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()

    def run(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def drain(self) -> None:
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
