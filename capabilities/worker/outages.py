"""A job's last writes outlast a database restart: tried again until it answers.

A run that ends while PostgreSQL restarts would otherwise leave its row `running`
with no record of its end, until the reaper calls its worker lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django import db

logger = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_WAIT_SECONDS = 0.25
LONGEST_WAIT_SECONDS = 2.0
# A restart takes seconds; past this the error is raised and the reaper answers the job.
GIVE_UP_AFTER_SECONDS = 60.0


def written(write: Callable[[], T], what: str) -> T:
    """`write()`, tried again while the database does not answer, for up to a minute.

    Meanwhile the job stays this process's: its heartbeat (written again once the
    database is back) keeps the reaper from calling its worker lost. Settles and stop
    records are conditional updates, so a write that did land before its connection
    broke is harmless again.
    """
    give_up_at = time.monotonic() + GIVE_UP_AFTER_SECONDS
    wait = FIRST_WAIT_SECONDS
    while True:
        try:
            return write()
        except (db.OperationalError, db.InterfaceError):
            if time.monotonic() + wait > give_up_at:
                raise
            logger.warning("The database did not answer (%s); trying again in %.2f s", what, wait)
            db.close_old_connections()  # the broken connection, so the next try opens one
            time.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT_SECONDS)
