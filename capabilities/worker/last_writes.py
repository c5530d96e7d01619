"""A job's last writes outlast a database restart: tried again until it answers.

A run that ends while PostgreSQL restarts would otherwise leave its row `running`
with no record of its end, until the reaper calls its worker lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from capabilities.jobs import outages

T = TypeVar("T")

# A restart takes seconds; past this the error is raised and the reaper answers the job.
GIVE_UP_AFTER_SECONDS = 60.0


def written(write: Callable[[], T], what: str) -> T:
    """`write()`, tried again while the database does not answer, for up to a minute.

    Meanwhile the job stays this process's: its heartbeat (written again once the
    database is back) keeps the reaper from calling its worker lost. Settles and stop
    records are conditional updates, so a write that did land before its connection
    broke is harmless again.
    """
    return outages.retried(
        write, what, away=outages.DATABASE_AWAY, for_seconds=GIVE_UP_AFTER_SECONDS
    )
