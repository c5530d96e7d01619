"""A consumer's call timers, which fire in its Background."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from capabilities.endings.background import Background


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
