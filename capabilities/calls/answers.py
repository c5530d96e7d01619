"""A call's answer for a door that waits on the call itself (MCP), decided here once.

The WebSocket doors take the same decisions through their session
(`capabilities/session/machine.py`) and `transport/session_io.py`; a door with no
session of its own takes them from here: start a call so that the caller's cancel
never leaves a job running for nobody, end it at its deadline, cancel it for its
caller. Every outcome goes through the one settle (`jobs/lifecycle.py`) and the one
cancel pipeline (`endings/cancellation.py`); a duration is `jobs/results.duration_ms`.
docs/design.md ("The path of one call") says why a start needs a ticket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from capabilities.access.principal import Principal
from capabilities.calls import start
from capabilities.calls.start_ticket import StartTicket
from capabilities.endings import background, cancellation
from capabilities.jobs import results
from capabilities.models import CancelSource, Job
from capabilities.protocol import responses


async def start_for_caller(
    principal: Principal,
    request: start.CallRequest,
    *,
    cancel_reason: str,
    cancel_source: Callable[[], CancelSource] = lambda: CancelSource.AGENT,
) -> Job:
    """`start.start`, safe against the caller being cancelled while the job is written.

    A cancel that comes before the row is written wins the call's ticket: the row is
    written settled (cancelled, delivered), so no worker ever runs it. One that comes
    later waits for the row, then cancels the job (`cancel_source()`) before re-raising.
    CallRefused if the call service refuses it.
    """
    ticket = StartTicket()
    # A cancellation stops the wait, never the insert half-way.
    starting = background.unstoppable(
        start.start(principal, dataclasses.replace(request, ticket=ticket))
    )
    try:
        return await asyncio.shield(starting)
    except BaseException:
        if starting.done() and (starting.cancelled() or starting.exception() is not None):
            raise  # the start itself failed (refused): nothing was stored
        settling = _settle_abandoned_start(starting, ticket, cancel_source(), cancel_reason)
        await background.waited(background.unstoppable(settling))
        raise


async def _settle_abandoned_start(
    starting: asyncio.Future[Job], ticket: StartTicket, source: CancelSource, reason: str
) -> None:
    """The caller left during its start: make sure its job, if any, does not run."""
    won_ticket = ticket.cancel(reason)
    with contextlib.suppress(start.CallRefused):
        job = await starting
        if not won_ticket:
            await cancellation.cancel_for_caller(job, source, reason)


def seconds_left(job: Job) -> float:
    """Seconds until the call's deadline (0 once it passed)."""
    if job.deadline is None:
        return 0.0
    return max(0.0, (job.deadline - timezone.now()).total_seconds())


async def end_for_caller(job: Job, source: CancelSource, reason: str) -> dict[str, Any] | None:
    """Settle the caller's call as cancelled by `source`, and stop its work.

    The cancelled ABPResponse if this settle won (its delivery is claimed in the same
    write); None if the call settled first, whose own outcome the caller then claims.
    """
    # Settle, then the abort flag: both happen even if the caller is cancelled meanwhile.
    won = background.unstoppable(cancellation.cancel_for_caller(job, source, reason))
    if not await background.waited(won):
        return None
    duration = results.duration_ms(job, settled_at=timezone.now())
    return responses.cancelled(job.call_id, source, duration)
