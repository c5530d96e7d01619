"""Hearing abort flags: one listener, with a sync face (a thread) and an async face.

Flags are raised by abort_flags.py, the only module that raises one: a key per job
plus a publish on the abort channel. A listener subscribes to that channel and stops
the job a message names, if it runs here. A flag raised while the listener was not
subscribed (starting, or reconnecting after Redis went away) was not heard, so after
every subscribe it looks at the flags of the jobs running here.

`AbortListener` decides; `ListenerThread` (a worker child: worker/interrupter.py)
and `listen` (Daphne's local lane: lane/lane.py) do the I/O around it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
import redis.asyncio
from django.conf import settings

from capabilities.jobs import abort_flags, outages

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 0.5
IDLE_WAKE_SECONDS = 1.0


class AbortListener:
    """What a listener does with what it hears (no I/O): which job to stop, when."""

    def __init__(
        self, name: str, running: Callable[[], Iterable[str]], stop: Callable[[str], object]
    ) -> None:
        self.name = name
        self._running = running
        self._stop = stop

    def to_check(self) -> list[str]:
        """The jobs running here, whose flags to look at after a subscribe."""
        return list(self._running())

    def found(self, job_id: str, raised: bool) -> None:
        """What a look at a job's flag found."""
        if raised:
            self._stop(job_id)

    def heard(self, message: dict[str, Any] | None) -> None:
        """A message from the channel (None: nothing came): stop its job if it runs here."""
        # No logging here: in a worker, a raise into the task's thread can land while
        # it holds a logging lock, and the listener must never wait on one.
        if message is not None and message.get("type") == "message":
            self._stop(message["data"].decode())

    def lost_redis(self) -> None:
        """The connection failed: it subscribes again shortly."""
        logger.warning("%s lost Redis; listening again", self.name, exc_info=True)


class ListenerThread(threading.Thread):
    """The sync face: a daemon thread, subscribed for the life of its process.

    `wait`: how long to wait for the next message; `tick`: called after each wait.
    """

    def __init__(
        self,
        listener: AbortListener,
        *,
        wait: Callable[[], float] = lambda: IDLE_WAKE_SECONDS,
        tick: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name=listener.name, daemon=True)
        self._listener = listener
        self._wait = wait
        self._tick = tick
        self.subscribed = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self._listen()
            except outages.REDIS_AWAY:
                self._listener.lost_redis()
                self.subscribed.clear()
                time.sleep(RECONNECT_SECONDS)

    def _listen(self) -> None:
        listener = self._listener
        client = redis.Redis.from_url(settings.REDIS_URL)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(abort_flags.channel())
            self.subscribed.set()
            for job_id in listener.to_check():
                listener.found(job_id, abort_flags.is_raised(job_id))
            while True:
                listener.heard(pubsub.get_message(timeout=self._wait()))
                self._tick()
        finally:
            pubsub.close()
            client.close()


async def listen(listener: AbortListener) -> None:
    """The async face: listen from this event loop until cancelled."""
    while True:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(abort_flags.channel())
            for job_id in listener.to_check():
                listener.found(job_id, await abort_flags.is_raised_async(job_id, client))
            async for message in pubsub.listen():
                listener.heard(message)
        except outages.REDIS_AWAY:
            listener.lost_redis()
            await asyncio.sleep(RECONNECT_SECONDS)
        finally:
            await pubsub.aclose()
            await client.aclose()
