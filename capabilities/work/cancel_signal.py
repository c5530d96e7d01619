"""A job's cancel as its work sees it: a flag, a wake-up for waits, callbacks.

Set once, from whichever thread hears of the cancel (the worker's abort watcher, a
test); read by `ctx.cancelled`, `ctx.wait()` and `ctx.checkpoint()` without I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class CancelSignal:
    """One job's cancel: set at most once, callbacks run once each."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []

    @property
    def is_set(self) -> bool:
        """Whether the job was cancelled."""
        return self._event.is_set()

    def set(self) -> None:
        """Mark the job cancelled, wake its waits, run its callbacks (in this thread)."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking on a cancel; True if cancelled."""
        return self._event.wait(max(seconds, 0.0))

    def add(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` on the cancel (at once if it came already); returns a remover."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        _call(callback)
        return lambda: None

    def _remove(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


def _call(callback: Callable[[], object]) -> None:
    # A callback's failure must not stop the others, nor the thread that cancels.
    try:
        callback()
    except Exception:
        logger.exception("An on_cancel callback failed")
