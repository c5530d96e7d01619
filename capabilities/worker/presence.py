"""A worker announces itself while it is alive (see capabilities/jobs/workers.py).

A thread in the worker's main process writes its key every
WORKER_ANNOUNCE_SECONDS, from `worker_ready` (the queues are chosen and the pool
is up) until `worker_shutdown`, which withdraws it (tasks.py connects both). The
main process tracks which tasks its pool runs (`celery.worker.state.active_requests`),
so the announcement names the jobs without asking the children.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery.concurrency.solo import TaskPool as SoloPool
from celery.worker import state

from capabilities.conf import abp_settings
from capabilities.jobs import dispatch, queue, workers

logger = logging.getLogger(__name__)


class Presence(threading.Thread):
    """Refreshes this worker's key until stopped."""

    def __init__(self, hostname: str, queues: tuple[str, ...], concurrency: int) -> None:
        super().__init__(name="abp-presence", daemon=True)
        self.hostname = hostname
        self._queues = queues
        self._concurrency = concurrency
        self._stopped = threading.Event()

    def snapshot(self) -> workers.LiveWorker:
        """This worker now."""
        jobs = tuple(
            sorted(
                str(request.id)
                for request in list(state.active_requests)
                if request.name == queue.RUN_JOB
            )
        )
        return workers.LiveWorker(
            hostname=self.hostname,
            queues=self._queues,
            concurrency=self._concurrency,
            jobs=jobs,
            pid=os.getpid(),
            announced_at=time.time(),
        )

    def run(self) -> None:
        interval = abp_settings().WORKER_ANNOUNCE_SECONDS
        while not self._stopped.is_set():
            try:
                if workers.announce(self.snapshot()):
                    redis_emptied()
            except Exception:
                logger.warning("Could not announce worker %s", self.hostname, exc_info=True)
            self._stopped.wait(interval)

    def stop(self) -> None:
        """Stop refreshing, and withdraw the key."""
        self._stopped.set()
        try:
            workers.withdraw(self.hostname)
        except Exception:
            logger.warning("Could not withdraw worker %s", self.hostname, exc_info=True)


_presence: Presence | None = None


def announce(sender: Any = None, **_: Any) -> None:
    """`worker_ready`: `sender` is the worker's consumer (its hostname, queues, pool)."""
    global _presence  # noqa: PLW0603 - one per worker process
    queues = tuple(sorted(sender.app.amqp.queues.consume_from))
    pool = sender.pool
    concurrency = 1 if isinstance(pool, SoloPool) else int(sender.controller.concurrency)
    _presence = Presence(str(sender.hostname), queues, concurrency)
    if workers.announce(_presence.snapshot()):
        redis_emptied()
    _presence.start()
    # Jobs waiting in the database for a worker of these queues can go now.
    dispatch.pump_safely(queues)


def redis_emptied() -> None:
    """This worker is the first to announce itself to Redis since it lost its data.

    The broker's queues may have gone with it (the same Redis, by default): jobs
    handed over and not started are handed over again now, not after
    REDISPATCH_AFTER_SECONDS.
    """
    if dispatch.redispatch_all():
        dispatch.pump_safely()


def withdraw(**_: Any) -> None:
    """`worker_shutdown`: the worker leaves at once, not when its key expires."""
    if _presence is not None:
        _presence.stop()
