"""A heartbeat thread: every third of WORKER_LOST_AFTER_SECONDS, some jobs are alive.

A thread of its own, with its own DB connection, so it keeps beating while the
thread doing the work is busy: a worker's task deep in a render, Daphne's one
database thread behind a crowd of resumes. The reaper fails a running job whose
heartbeat went stale with WORKER_LOST: when the process dies, its beat stops, and
the job's agent still gets an answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import close_old_connections, connection

from capabilities.conf import abp_settings

logger = logging.getLogger(__name__)


class HeartbeatThread(threading.Thread):
    """Calls `beat` (which writes heartbeats) every third of WORKER_LOST_AFTER_SECONDS."""

    def __init__(self, name: str, beat: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._beat = beat
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Beat no more (the process's own threads beat as long as it lives)."""
        self._stopped.set()

    def run(self) -> None:
        interval = abp_settings().WORKER_LOST_AFTER_SECONDS / 3
        try:
            while not self._stopped.wait(interval):
                try:
                    close_old_connections()  # one the server dropped is not used again
                    self._beat()
                except Exception:
                    logger.warning("%s: heartbeat not written", self.name, exc_info=True)
        finally:
            connection.close()
