"""What a new job's queue and principal hold now, in one statement built once.

The questions asked on every call's way in: may the principal have one more call
(its budget), and may this one go to Celery at once (fair shares)? One statement
answers both. The ORM would rebuild four filtered aggregates in Python each time,
in the thread that also serves Daphne's calls; the statement text is built once
from the model's metadata instead, as in row_updates.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.db import connection

from capabilities.jobs.columns import quoted_column
from capabilities.models import ACTIVE_STATUSES, Job


@dataclass(frozen=True)
class SlotCounts:
    """Active jobs: the principal's, and on the queue or of the principal handed over, waiting."""

    held: int
    busy: int
    mine: int
    waiting: int


def _column(name: str) -> str:
    return quoted_column(Job, name)


@functools.cache
def _statement(vendor: str) -> str:
    handed, queue, principal = _column("dispatched_at"), _column("queue"), _column("principal")
    statuses = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    return (
        f"SELECT"
        f" COALESCE(SUM(CASE WHEN {principal} = %s THEN 1 ELSE 0 END), 0),"
        f" COALESCE(SUM(CASE WHEN {handed} IS NOT NULL AND {queue} = %s THEN 1 ELSE 0 END), 0),"
        f" COALESCE(SUM(CASE WHEN {handed} IS NOT NULL AND {principal} = %s THEN 1 ELSE 0 END), 0),"
        f" COALESCE(SUM(CASE WHEN {handed} IS NULL AND {queue} = %s THEN 1 ELSE 0 END), 0)"
        f" FROM {connection.ops.quote_name(Job._meta.db_table)}"
        f" WHERE {_column('status')} IN ({statuses})"
    )


def slot_counts(queue: str, principal: str) -> SlotCounts:
    """The principal's active jobs; the queue's and the principal's handed over; waiting."""
    params = [principal, queue, principal, queue, *ACTIVE_STATUSES]
    with connection.cursor() as cursor:
        cursor.execute(_statement(connection.vendor), params)
        held, busy, mine, waiting = cursor.fetchone()
    return SlotCounts(held=int(held), busy=int(busy), mine=int(mine), waiting=int(waiting))


class SlotTally:
    """Slot counts for a batch of new jobs: read once per queue and principal, then kept.

    Each new row is added as it is written, so every job of the batch sees the counts
    a statement of its own would have read (calls/job_writes.py).
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], SlotCounts] = {}

    def counts(self, queue: str, principal: str) -> SlotCounts:
        """What the queue and the principal hold, with the batch's rows so far."""
        key = (queue, principal)
        if key not in self._counts:
            self._counts[key] = slot_counts(queue, principal)
        return self._counts[key]

    def add(self, job: Job) -> None:
        """Count a row just written."""
        if job.status not in ACTIVE_STATUSES:
            return
        handed = job.dispatched_at is not None
        for (queue, principal), was in self._counts.items():
            self._counts[(queue, principal)] = SlotCounts(
                held=was.held + (job.principal == principal),
                busy=was.busy + (handed and job.queue == queue),
                mine=was.mine + (handed and job.principal == principal),
                waiting=was.waiting + (not handed and job.queue == queue),
            )
