"""The call service's runs in this Daphne's lane: run a job written to run here, then settle it.

When a run ends, the connection that made the call, if it still holds it, settles the
job and claims its delivery in one conditional UPDATE and answers at once (`Deliver`);
otherwise the job is settled here and the session's group hears of the result, as
from a worker. The lane itself (lane/lane.py) knows nothing of settling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async

from capabilities import tracing
from capabilities.calls import job_writes
from capabilities.conf import abp_settings
from capabilities.jobs import lifecycle, results
from capabilities.lane import lane
from capabilities.models import Job

logger = logging.getLogger(__name__)

# Settles a finished run and answers it, if this connection holds the call; False:
# it does not, and the session's group hears of the result instead.
Deliver = Callable[[Job, lifecycle.Outcome, dict[str, Any]], Awaitable[bool]]

_tasks: set[asyncio.Task[None]] = set()


def spawn(job: Job, params: dict[str, Any], deliver: Deliver | None) -> None:
    """Run a job written to run here, and settle it, in a task of its own.

    The run holds the place its start took (`lane.LocalLane.takes`) until it ends.
    """
    task = asyncio.create_task(_run_job(job, params, deliver))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _run_job(job: Job, params: dict[str, Any], deliver: Deliver | None) -> None:
    here = lane.current()
    here.unsettled.add(str(job.id))
    try:
        # The lane's own cap; the call's deadline cancels it as any call's does.
        seconds = abp_settings().LOCAL_LANE_TIME_LIMIT_SECONDS
        outcome = await _ran(here, job, params, seconds)
        if outcome is None:  # stopped: whoever stopped it settled it first
            await database_sync_to_async(lifecycle.record_stopped)(job.id)
            return
        response = results.outcome_response(job, outcome)
        if deliver is not None and await deliver(job, outcome, response):
            return
        await job_writes.settle(
            job_writes.LocalSettle(job=job, outcome=outcome, response=response, answered_here=False)
        )
    except Exception:
        # The row stays running; the reaper fails it WORKER_LOST, and its agent hears.
        logger.exception("Local run of job %s failed", job.id)
    finally:
        here.unsettled.discard(str(job.id))
        here.give_back()


async def _ran(
    here: lane.LocalLane, job: Job, params: dict[str, Any], seconds: float
) -> lifecycle.Outcome | None:
    """The lane's run of the job, under `abp.run` while traces are on."""
    if not tracing.enabled():
        return await here.run(str(job.id), job.capability, params, seconds, job.user_id)
    with tracing.span(
        "abp.run", job.trace_parent, job_id=job.id, capability=job.capability, worker=job.worker
    ):
        return await here.run(str(job.id), job.capability, params, seconds, job.user_id)
