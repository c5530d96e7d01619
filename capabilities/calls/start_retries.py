"""A call's row written again while the database is away, instead of refusing the call.

A PostgreSQL restart or failover breaks every open connection for a few seconds; a
call that arrives then would be refused with a retryable INTERNAL_ERROR, and its
agent left to try again. Instead its row is written again, with growing pauses, for
up to ABP_START_RETRY_SECONDS; the call just waits.

Writing again is safe: a callId is unique in its session. An attempt whose commit
was sent but whose answer was lost with the connection may have written the row;
the next attempt then finds the callId taken by the same call
(`CallIdInUse.existing`), and that row is the one written.
Such a row's hand-over (`dispatch.created`, run on commit) did not run: the pump or
the sweep hands it over (docs/design.md, "A start while the database is away").
"""

from __future__ import annotations

import asyncio
import logging

from capabilities.calls import job_writes
from capabilities.conf import abp_settings
from capabilities.jobs import outages
from capabilities.jobs.lifecycle import CallIdInUse
from capabilities.models import Job

logger = logging.getLogger(__name__)


async def stored(writing: asyncio.Future[Job], new: job_writes.NewJob) -> Job:
    """The job once its row is written (`writing`, then attempts of `new` as needed)."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + abp_settings().START_RETRY_SECONDS
    for attempt, pause in enumerate(outages.pauses()):
        try:
            return await writing
        except CallIdInUse as in_use:
            if attempt == 0 or in_use.existing is None:
                raise  # held before this start, or by another call
            return in_use.existing  # written by the attempt whose answer was lost
        except outages.DATABASE_AWAY as away:
            if loop.time() + pause > give_up_at:
                raise
            logger.warning(
                "Call %s: the database is away (%s); writing its row again in %g s",
                new.job["call_id"], str(away).strip()[:200], pause,
            )  # fmt: skip
        await asyncio.sleep(pause)
        writing = job_writes.create(new)
    raise AssertionError("outages.pauses() never ends")
