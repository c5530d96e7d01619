"""The one cancel pipeline, for every source: settle first, then the flag and the revoke.

Agent, operator, timeout, disconnect, shutdown, revoked key, expired session: each
settles the job through `lifecycle.settle` (one conditional UPDATE; the row count
says who won), and only the winner stops the work, by raising the abort flag and
revoking the task. A lost worker is settled the same way, as WORKER_LOST.

A consumer that wins a cancel answers its agent between the two steps
(`settle_cancelled`, then `stop_work`); anyone else calls `cancel`, and the
session's consumer hears of the outcome through the channel layer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from datetime import datetime

from channels.db import database_sync_to_async

from capabilities import tracing
from capabilities.endings.background import Background
from capabilities.jobs import abort_flags, dispatch, notes, queue
from capabilities.jobs.lifecycle import Outcome, record_stopped, settle
from capabilities.models import ACTIVE_STATUSES, CancelSource, Job
from capabilities.protocol import ErrorCode, WireError

logger = logging.getLogger(__name__)


def settle_cancelled(
    job_ids: list[str],
    source: CancelSource,
    reason: str = "",
    *,
    delivered: bool = False,
    generation: int = 0,
) -> dict[str, bool]:
    """Step one: settle the jobs as cancelled; which settles won.

    `delivered`: the caller, a connection of session `generation`, sends the cancelled
    results at once (see `claim_delivery`).
    """
    outcome = Outcome.cancelled(source, reason)
    if not tracing.enabled():
        return {
            job_id: settle(job_id, outcome, delivered=delivered, generation=generation)
            for job_id in job_ids
        }
    won: dict[str, bool] = {}
    for job_id, trace_parent in _trace_parents(job_ids).items():
        # Its own span in the call's trace, linked to the call's span: a cancel may
        # come long after the call, from anyone (an operator, the reaper).
        with tracing.span("abp.cancel", trace_parent, link=True, job_id=job_id, source=source):
            won[job_id] = settle(job_id, outcome, delivered=delivered, generation=generation)
    return won


def _trace_parents(job_ids: list[str]) -> dict[str, str]:
    """Each job's call's traceparent ("" for none), in the order given."""
    found = dict(Job.objects.filter(pk__in=job_ids).values_list("id", "trace_parent").iterator())
    return {job_id: found.get(uuid.UUID(job_id), "") for job_id in job_ids}


def stop_work(job_id: str) -> None:
    """Step two, after a won settle: raise the abort flag, then revoke the task."""
    abort_flags.raise_flag(job_id)
    queue.revoke(job_id)


async def stop_work_async(job_id: str) -> Awaitable[None]:
    """`stop_work` from an event loop: the flag now; the revoke, off the loop, returned.

    The flag is what stops the work, so it goes up before the caller moves on; the
    revoke only keeps a queued task from being picked up, and may finish later.
    """
    try:
        await abort_flags.raise_flag_async(job_id)
    except Exception:
        # The agent has its answer; without the flag the work runs on until the
        # reaper kills it (a cancelled job whose worker has not stopped).
        logger.exception("Could not raise the abort flag of job %s", job_id)
    return asyncio.get_running_loop().run_in_executor(None, queue.revoke, job_id)


async def cancel_for_caller(job: Job, source: CancelSource, reason: str = "") -> bool:
    """Settle the caller's own call as cancelled, then stop the work; True if it won.

    The caller answers at once (its response claimed in the same write); the
    revoke finishes in the background.
    """
    job_id = str(job.id)
    won: dict[str, bool] = await database_sync_to_async(settle_cancelled)(
        [job_id], source, reason, delivered=True
    )
    if won[job_id]:
        revoke = await stop_work_async(job_id)
        _BACKGROUND.run(revoke)
    return won[job_id]


# Revokes of cancels this process settled, until they are out.
_BACKGROUND = Background()


def cancel(job_id: uuid.UUID | str, *, source: CancelSource, reason: str = "") -> bool:
    """The whole pipeline, for a cancel no connection is waiting on; True if it won.

    The session's consumer (on any Daphne) hears of it and answers its agent.
    """
    job_id = str(job_id)
    if not settle_cancelled([job_id], source, reason)[job_id]:
        return False
    abort_flags.raise_flag(job_id)
    tell_session(job_id)
    queue.revoke(job_id)
    return True


def cancel_session_calls(
    session_id: uuid.UUID | str, *, source: CancelSource, reason: str = ""
) -> int:
    """`cancel` every call of a session still in flight; how many this settled."""
    active = Job.objects.filter(session_id=uuid.UUID(str(session_id)), status__in=ACTIVE_STATUSES)
    return sum(
        cancel(job_id, source=source, reason=reason)
        for job_id in active.values_list("id", flat=True)
    )


def fail_lost(job_id: uuid.UUID | str, *, last_seen: datetime | None = None) -> bool:
    """Fail a job whose worker died (retryable), tell its agent; True if this settled it."""
    error = WireError(
        code=ErrorCode.WORKER_LOST,
        message="The worker running this call stopped unexpectedly; it can be retried.",
        retryable=True,
    )
    if not settle(job_id, Outcome.failed(error)):
        return False
    record_stopped(job_id, at=last_seen)
    tell_session(job_id)
    # Its worker slot is free (or its worker gone, which the pump reads).
    dispatch.pump_safely()
    return True


def tell_session(job_id: uuid.UUID | str) -> None:
    """Tell the job's session consumer (on any Daphne) that the job settled."""
    job = Job.objects.filter(pk=job_id).only("session_id", "call_id").first()
    if job is not None:
        notes.notify(str(job.session_id), notes.job_settled(job.call_id))
