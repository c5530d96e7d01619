"""The periodic sweep (`abp.reap`, on beat's schedule): ends what no live process ended.

Timeouts are enforced here even when the agent and its consumer are gone, a
worker that keeps running a cancelled job past the grace period is killed, and
sessions nobody resumed in time have their calls cancelled.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.endings import cancellation, key_revocation, resumption, user_deactivation
from capabilities.jobs import dispatch, lifecycle, queue
from capabilities.models import ACTIVE_STATUSES, CancelSource, Job, JobStatus

logger = logging.getLogger(__name__)

BATCH = 500
# Give up re-sending kills for a job this long after its grace period.
KILL_WINDOW = timedelta(minutes=5)


def reap() -> None:
    """One sweep."""
    now = timezone.now()
    overdue = Job.objects.filter(status__in=ACTIVE_STATUSES, deadline__lt=now).values_list(
        "id", flat=True
    )[:BATCH]
    for job_id in overdue:
        end_overdue(str(job_id))
    grace = timedelta(seconds=abp_settings().HARD_KILL_GRACE_SECONDS)
    stuck = Job.objects.filter(
        status=JobStatus.CANCELLED,
        started_at__isnull=False,
        stopped_at__isnull=True,
        settled_at__lt=now - grace,
        settled_at__gt=now - grace - KILL_WINDOW,
    ).values_list("id", flat=True)[:BATCH]
    for job_id in stuck:
        logger.warning("Job %s still running %s after its cancel: killing", job_id, grace)
        queue.revoke(str(job_id), kill=True)
    stale = now - timedelta(seconds=abp_settings().WORKER_LOST_AFTER_SECONDS)
    lost = Job.objects.filter(status=JobStatus.RUNNING, heartbeat_at__lt=stale).values_list(
        "id", "heartbeat_at"
    )[:BATCH]
    for job_id, last_seen in lost:
        if cancellation.fail_lost(job_id, last_seen=last_seen):
            logger.warning("Job %s lost its worker (last heartbeat %s)", job_id, last_seen)
    stopped_with_process(stale)
    resumption.expire_abandoned()
    resumption.nudge_undelivered()
    key_revocation.finish_revocations()
    user_deactivation.finish_deactivations()
    # Behind every other trigger: jobs whose message was lost, and any slot a
    # pump missed (a process that died between a settle and its pump).
    dispatch.redispatch_stale()
    dispatch.pump_safely()


def stopped_with_process(stale: datetime) -> None:
    """Record the stop of cancelled work whose process died before it could say so.

    A process beats for its cancelled job until the work stops (`lifecycle.heartbeat`);
    a worker killed meanwhile (SIGKILL, the machine) records nothing, so its beat going
    stale is the stop, at the last beat. A child that dies is told of by Celery at once
    (`tasks._on_failure`).
    """
    gone = Job.objects.filter(
        status=JobStatus.CANCELLED,
        started_at__isnull=False,
        stopped_at__isnull=True,
        heartbeat_at__lt=stale,
    ).values_list("id", "heartbeat_at")[:BATCH]
    for job_id, last_seen in gone:
        lifecycle.record_stopped(job_id, at=last_seen)
        logger.warning("Job %s stopped with its process (last heartbeat %s)", job_id, last_seen)


def end_overdue(job_id: str) -> None:
    """Settle a job past its deadline as timed out, and tell its agent."""
    if cancellation.cancel(job_id, source=CancelSource.TIMEOUT, reason="deadline passed"):
        logger.info("Job %s timed out", job_id)
