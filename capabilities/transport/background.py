"""What a consumer runs besides its replies: call timers, and bookkeeping nobody waits on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
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


class Timers:
    """One timer per call: `fire(call_id)` runs in the background when it is due."""

    def __init__(
        self, background: Background, fire: Callable[[str], Coroutine[Any, Any, None]]
    ) -> None:
        self._background = background
        self._fire = fire
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def start(self, call_id: str, seconds: float) -> None:
        self.stop(call_id)
        self._timers[call_id] = asyncio.get_running_loop().call_later(
            seconds, lambda: self._background.run(self._fire(call_id))
        )

    def stop(self, call_id: str) -> None:
        timer = self._timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()

    def stop_all(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
