"""The local lane's heartbeat: Daphne says its lane's jobs are alive until they are settled.

A thread of its own, with its own DB connection, as a worker's heartbeat is. A job
run in the lane is settled by Daphne's one database thread, which may be busy (a
replica taking hundreds of resumes at once): until then the heartbeat keeps the
reaper from failing the job WORKER_LOST. When Daphne dies, it stops, and the
reaper answers its jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections, connection

from capabilities.jobs import lifecycle

logger = logging.getLogger(__name__)


class LaneHeartbeat(threading.Thread):
    """Writes the heartbeat of `jobs()` every third of WORKER_LOST_AFTER_SECONDS."""

    def __init__(self, jobs: Callable[[], list[str]]) -> None:
        super().__init__(name="abp-lane-heartbeat", daemon=True)
        self._jobs = jobs

    def run(self) -> None:
        interval = float(settings.ABP["WORKER_LOST_AFTER_SECONDS"]) / 3
        try:
            while True:
                time.sleep(interval)
                job_ids = self._jobs()
                if not job_ids:
                    continue
                try:
                    close_old_connections()  # one the server dropped is not used again
                    lifecycle.heartbeat_all(job_ids)
                except Exception:
                    logger.warning("Heartbeat of local jobs %s not written", job_ids, exc_info=True)
        finally:
            connection.close()
