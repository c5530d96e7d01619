"""Fair shares: jobs wait in the database and go to Celery as worker slots free up.

Celery's queues are first in, first out: an agent that queued 200 PDFs would hold
every worker until the last of them ran. So a new job stays in its row (queued,
`dispatched_at` null) and is handed to Celery only when its queue has a free slot
(the live workers' concurrency, capabilities/jobs/workers.py, less the jobs
already handed over and not settled). Each free slot goes to the agent with the
fewest jobs running, oldest waiting job first, and never beyond that agent's share
(`max_running`, its key's MAX_CONCURRENT_CALLS). Within one agent, jobs start in
the order they were made.

Handing a job over is a conditional UPDATE (`WHERE status = queued AND
dispatched_at IS NULL`): a job settled while it waited (a cancel, a timeout) is
never sent, and two pumps never send the same job. Pumps run wherever a slot may
have freed or a job arrived: after a job is created, after every settle, when a
worker announces itself, and in every reaper sweep. They take no lock: two pumps
racing may hand over one job too many, which then waits in Celery for a moment.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Max, Min, QuerySet
from django.utils import timezone

from capabilities import tracing
from capabilities.conf import abp_settings
from capabilities.jobs import notes, queue, row_updates, workers
from capabilities.jobs.slot_counts import SlotCounts, slot_counts
from capabilities.models import ACTIVE_STATUSES, Job, JobStatus

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class _Line:
    """One principal's jobs on one queue: how many run, how many wait."""

    running: int = 0
    waiting: int = 0
    share: int = 0
    first_waiting: datetime | None = None
    taken: int = 0


def pump(queues: Iterable[str] | None = None) -> list[str]:
    """Hand waiting jobs to Celery where slots are free; the ids handed over."""
    if not Job.objects.filter(status=JobStatus.QUEUED, dispatched_at__isnull=True).exists():
        return []
    slots = workers.capacity(workers.recent())
    names = sorted(set(queues) if queues is not None else _queues_with_waiting())
    sent: list[str] = []
    for name in names:
        if slots.get(name, 0) > 0:
            sent += _pump_queue(name, slots[name])
    return sent


def may_go_now(queue_name: str, principal: str, share: int, counts: SlotCounts | None) -> bool:
    """Whether a job about to be created may be handed over at once.

    The common case: a free slot on its queue, its principal within its share, and
    nobody waiting there. The job is then stored already handed over and sent on
    commit, with no second write. Live workers are read as this process last saw
    them (at most AVAILABILITY_POLL_SECONDS ago): a job sent to a worker that just
    died waits in Celery for the next one, or is handed over again. `counts`: as
    the caller already read them in this hop, or None to read them here.
    """
    slots = workers.capacity(workers.recent()).get(queue_name, 0)
    if slots <= 0:
        return False
    if counts is None:
        counts = slot_counts(queue_name, principal)
    return counts.waiting == 0 and counts.busy < slots and counts.mine < share


def created(job: Job) -> None:
    """A new job is committed: send it, or pump its queue and tell it its place."""
    if job.dispatched_at is not None:
        queue.enqueue(job)
        return
    slots = workers.capacity(workers.recent()).get(job.queue, 0)
    if slots > 0 and str(job.id) in _pump_queue(job.queue, slots):
        return
    if job.progress_token is not None:
        tell_position(job, position(job))


def pump_safely(queues: Iterable[str] | None = None) -> None:
    """`pump`, for callers that must go on whatever happens (the reaper sweeps again)."""
    try:
        pump(queues)
    except Exception:
        logger.exception("Could not dispatch waiting jobs")


def _queues_with_waiting() -> set[str]:
    return set(
        Job.objects.filter(status=JobStatus.QUEUED, dispatched_at__isnull=True)
        .order_by()
        .values_list("queue", flat=True)
        .distinct()
    )


def _pump_queue(name: str, slots: int) -> list[str]:
    lines: dict[str, _Line] = {}
    # Who waits first: most pumps (every settle) find nobody waiting, and stop here.
    heads = (
        Job.objects.filter(status=JobStatus.QUEUED, dispatched_at__isnull=True, queue=name)
        .order_by()
        .values_list("principal")
        .annotate(n=Count("id"), first=Min("created_at"), share=Max("max_running"))
    )
    for principal, waiting, first, share in heads:
        lines[principal] = _Line(waiting=waiting, first_waiting=first, share=share)
    if not lines:
        return []
    busy = 0
    handed = (
        Job.objects.filter(status__in=ACTIVE_STATUSES, dispatched_at__isnull=False)
        .order_by()
        .values_list("principal", "queue")
        .annotate(n=Count("id"))
    )
    for principal, job_queue, n in handed:
        # A share counts the principal's jobs on every queue; the slots, this queue's.
        lines.setdefault(principal, _Line()).running += n
        if job_queue == name:
            busy += n
    free = slots - busy
    while free > 0:
        ready = [
            (line.running + line.taken, line.first_waiting, principal)
            for principal, line in lines.items()
            if line.taken < line.waiting and line.running + line.taken < line.share
        ]
        if not ready:
            break
        _, _, principal = min(ready, key=lambda entry: (entry[0], entry[1] or timezone.now()))
        lines[principal].taken += 1
        free -= 1
    sent: list[str] = []
    for principal, line in lines.items():
        if line.taken:
            sent += _hand_over(name, principal, line.taken)
    return sent


# What the hand-over reads of each waiting job, as plain values (no model instances).
_LINE_COLUMNS = ("id", "capability", "deadline", "session_id", "call_id", "progress_token")


def _hand_over(name: str, principal: str, count: int) -> list[str]:
    """Send the principal's `count` oldest waiting jobs on the queue to Celery."""
    columns = (*_LINE_COLUMNS, "trace_parent") if tracing.enabled() else _LINE_COLUMNS
    line = [
        Job(**dict(zip(columns, row, strict=True)))
        for row in Job.objects.filter(
            status=JobStatus.QUEUED, dispatched_at__isnull=True, queue=name, principal=principal
        )
        .order_by("created_at")
        .values_list(*columns)[: count + abp_settings().QUEUE_POSITION_UPDATES]
    ]
    sent: list[str] = []
    for job in line[:count]:
        if claim(job.id):
            queue.enqueue(job)
            sent.append(str(job.id))
    _tell_positions(line[count:])
    return sent


def claim(job_id: uuid.UUID | str) -> bool:
    """Mark a waiting job handed over; False if it was settled or handed over already."""
    return row_updates.update_if(
        job_id,
        (JobStatus.QUEUED,),
        {"dispatched_at": timezone.now()},
        where_null="dispatched_at",
    )


def position(job: Job) -> int:
    """A waiting job's place in its principal's line on its queue (1: next to go)."""
    ahead = Job.objects.filter(
        status=JobStatus.QUEUED,
        dispatched_at__isnull=True,
        queue=job.queue,
        principal=job.principal,
        created_at__lt=job.created_at,
    ).count()
    return ahead + 1


def tell_position(job: Job, place: int) -> None:
    """Progress for a waiting job whose agent asked for it: stage "queued", its place."""
    if job.progress_token is None:
        return
    note = notes.job_progress(job.call_id, progress=0, total=None, stage="queued", position=place)
    notes.notify(str(job.session_id), note)


def _tell_positions(still_waiting: list[Job]) -> None:
    for place, job in enumerate(still_waiting, start=1):
        tell_position(job, place)


def redispatch_stale() -> int:
    """Hand over again jobs handed to Celery long ago and never started.

    With early acks, a worker that dies holds the messages it had reserved;
    starting a job is conditional (queued -> running), so a second copy runs once.
    """
    cutoff = timezone.now() - timedelta(seconds=abp_settings().REDISPATCH_AFTER_SECONDS)
    return _hand_back(Job.objects.filter(dispatched_at__lt=cutoff), "were never started")


def redispatch_all() -> int:
    """Hand over again every job handed to Celery and not started yet, at once.

    For a Redis that lost its data: the messages still in its queues are gone, and
    their jobs would otherwise hold their slots until REDISPATCH_AFTER_SECONDS.
    Copies a worker had already reserved run once, like any second copy.
    """
    return _hand_back(Job.objects.filter(dispatched_at__isnull=False), "may have lost")


def _hand_back(handed: QuerySet[Job], why: str) -> int:
    count = handed.filter(status=JobStatus.QUEUED).update(dispatched_at=None)
    if count:
        logger.warning("%d jobs handed to Celery %s: handing them over again", count, why)
    return count
