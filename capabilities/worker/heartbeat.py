"""Each worker process says, every few seconds, that the job it runs is still alive.

A thread of its own (its own DB connection): it keeps beating while the task's
thread is deep in a render. The reaper fails a running job whose heartbeat went
stale with WORKER_LOST, so a worker killed by the kernel, an operator or a
crash still gets its agent an answer.

The same write carries the job's last progress report if the DB interval held it
back (a job that reported early, then went quiet), so the admin catches up.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection

from capabilities.jobs import lifecycle
from capabilities.worker import executor
from capabilities.worker.interrupter import INTERRUPTER, Interrupter

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Writes the current job's heartbeat every third of WORKER_LOST_AFTER_SECONDS."""

    def __init__(self, interrupter: Interrupter) -> None:
        super().__init__(name="abp-heartbeat", daemon=True)
        self._interrupter = interrupter

    def run(self) -> None:
        interval = settings.ABP["WORKER_LOST_AFTER_SECONDS"] / 3
        try:
            while True:
                time.sleep(interval)
                job_id = self._interrupter.current_job_id
                if job_id is None:
                    continue
                try:
                    # A progress report held back by the DB interval goes with it.
                    lifecycle.heartbeat(job_id, executor.take_unsaved_progress(job_id))
                except Exception:
                    logger.warning("Heartbeat of job %s not written", job_id, exc_info=True)
        finally:
            connection.close()


_heartbeat: Heartbeat | None = None


def start() -> Heartbeat:
    """Start this process's heartbeat once (in each worker child after fork)."""
    global _heartbeat  # noqa: PLW0603 - one per process
    if _heartbeat is None or not _heartbeat.is_alive():
        _heartbeat = Heartbeat(INTERRUPTER)
        _heartbeat.start()
    return _heartbeat
