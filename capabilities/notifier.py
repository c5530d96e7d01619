"""Send channel-layer messages to session groups from sync code (workers, admin, reaper).

`async_to_sync(layer.group_send)` would start a new event loop, and with it a new
Redis connection, for every message. Instead each process keeps one loop in a
background thread: messages go out in the order they were sent, over warm
connections, and the caller waits only when it asks to (`flush`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any

from channels.layers import get_channel_layer

from capabilities.models import session_group

logger = logging.getLogger(__name__)


class Notifier:
    """An ordered, non-blocking sender to channel-layer groups."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[tuple[str, dict[str, Any], Future[None]]] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="abp-notifier", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._queue = asyncio.Queue()
        self._ready.set()
        self._loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        assert self._queue is not None
        layer = get_channel_layer()
        while True:
            group, message, done = await self._queue.get()
            try:
                await layer.group_send(group, message)
            except Exception as exc:  # a lost note is recovered from the DB (resume)
                logger.warning("Could not send %s to %s", message.get("type"), group, exc_info=True)
                done.set_exception(exc)
            else:
                done.set_result(None)

    def send(self, session_id: str, message: dict[str, Any]) -> Future[None]:
        """Queue a message for a session's group; returns a future of its sending."""
        done: Future[None] = Future()
        queue = self._queue
        assert queue is not None
        self._loop.call_soon_threadsafe(
            queue.put_nowait, (session_group(session_id), message, done)
        )
        return done


_notifier: Notifier | None = None
_notifier_pid: int | None = None
_lock = threading.Lock()


def notifier() -> Notifier:
    """This process's notifier (a forked child gets its own)."""
    global _notifier, _notifier_pid  # noqa: PLW0603 - one per process
    with _lock:
        if _notifier is None or _notifier_pid != os.getpid():
            _notifier = Notifier()
            _notifier_pid = os.getpid()
        return _notifier


def notify(session_id: str, message: dict[str, Any], *, wait: float | None = None) -> None:
    """Send a message to a session's consumer; optionally wait until it is out."""
    done = notifier().send(session_id, message)
    if wait is not None:
        try:
            done.result(timeout=wait)
        except Exception:
            logger.warning("Note to session %s not confirmed", session_id, exc_info=True)
