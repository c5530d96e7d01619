"""Queue and revoke job tasks by name: the job side never loads the worker's code.

Each job goes to its capability's queue: the queue of its cost class (small or
heavy, abp_settings().QUEUES) unless ABP_CAPABILITY_QUEUES moves it elsewhere.

Celery's `send_task` and `control.revoke` need only the task's name and the broker,
so Daphne and the admin enqueue without importing the tasks (and with them
WeasyPrint and Pillow). The worker registers its tasks under these names.
"""

from __future__ import annotations

import math
from typing import Any

from celery import current_app
from django.utils import timezone

from capabilities import tracing
from capabilities.conf import abp_settings
from capabilities.models import Job
from capabilities.work import registry

RUN_JOB = "abp.run_job"
# Not a Celery queue: the jobs a Daphne runs itself (capabilities/lane/).
LOCAL_QUEUE = "local"


def enqueue(job: Job) -> None:
    """Queue the job's task (its id is the job's), with the deadline as backstops."""
    if not tracing.enabled():
        _send(job)
        return
    with tracing.span(
        "abp.dispatch", job.trace_parent, job_id=job.id, queue=queue_for(job.capability)
    ):
        # The worker's run joins the trace from these (opentelemetry-instrumentation-
        # celery reads them); Daphne sends by name, which that library cannot trace.
        _send(job, headers=tracing.headers(job.trace_parent))


def _send(job: Job, **options: Any) -> None:
    assert job.deadline is not None
    remaining = max((job.deadline - timezone.now()).total_seconds(), 0.001)
    grace = abp_settings().HARD_KILL_GRACE_SECONDS
    current_app.send_task(
        RUN_JOB,
        args=(str(job.id),),
        task_id=str(job.id),
        queue=queue_for(job.capability),
        # Backstops behind the session's timer and the reaper: a queued task past its
        # deadline is dropped by the worker, a running one gets the soft limit raised.
        expires=job.deadline,
        # Whole seconds, rounded up: the precise deadline is the session's and the reaper's.
        soft_time_limit=math.ceil(remaining),
        time_limit=math.ceil(remaining + grace),
        **options,
    )


def queue_for(capability: str) -> str:
    """The queue a capability's jobs go to: its own setting, else its cost's."""
    abp = abp_settings()
    moved: str | None = abp.CAPABILITY_QUEUES.get(capability)
    if moved:
        return moved
    spec = registry.get(capability)
    cost = spec.cost if spec is not None else "heavy"
    # A cost class's queue, or a queue of the capability's own (`cost="reports"`).
    return abp.QUEUES.for_cost(cost)


def revoke(job_id: str, *, kill: bool = False) -> None:
    """Tell workers to skip the task, or (kill) to SIGKILL the process running it."""
    if kill:
        current_app.control.revoke(job_id, terminate=True, signal="SIGKILL")
    else:
        current_app.control.revoke(job_id)
