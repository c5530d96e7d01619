"""Queue and revoke job tasks by name: the job side never loads the worker's code.

Celery's `send_task` and `control.revoke` need only the task's name and the broker,
so Daphne and the admin enqueue without importing the tasks (and with them
WeasyPrint and Pillow). The worker registers its tasks under these names.
"""

from __future__ import annotations

import math

from celery import current_app
from django.conf import settings
from django.utils import timezone

from capabilities.models import Job

RUN_JOB = "abp.run_job"


def enqueue(job: Job) -> None:
    """Queue the job's task (its id is the job's), with the deadline as backstops."""
    assert job.deadline is not None
    remaining = max((job.deadline - timezone.now()).total_seconds(), 0.001)
    grace = settings.ABP["HARD_KILL_GRACE_SECONDS"]
    current_app.send_task(
        RUN_JOB,
        args=(str(job.id),),
        task_id=str(job.id),
        # Backstops behind the session's timer and the reaper: a queued task past its
        # deadline is dropped by the worker, a running one gets the soft limit raised.
        expires=job.deadline,
        # Whole seconds, rounded up: the precise deadline is the session's and the reaper's.
        soft_time_limit=math.ceil(remaining),
        time_limit=math.ceil(remaining + grace),
    )


def revoke(job_id: str, *, kill: bool = False) -> None:
    """Tell workers to skip the task, or (kill) to SIGKILL the process running it."""
    if kill:
        current_app.control.revoke(job_id, terminate=True, signal="SIGKILL")
    else:
        current_app.control.revoke(job_id)
