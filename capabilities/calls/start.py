"""Starting a call: every check, in order, then the job. The same for every door.

What the principal may call and how much it may send, its calls per minute, the
capability's schema and the uploads it names, then (in the same thread hop that
stores the row, calls/job_writes.py) whether a live worker can run it and how many
calls the principal has queued. Nothing is stored or queued before every check has passed.

A callId is unique in its session, and its row keeps a hash of the call
(`protocol/call_digest.py`): a start that finds its callId taken by the very same call
is told which job holds it (`CallIdHeld`), to adopt instead of running it twice;
one that finds another call there is refused (`CallIdTaken`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capabilities import tracing
from capabilities.access import rate_limits
from capabilities.access.principal import Principal
from capabilities.calls import budgets, job_writes, lane_runs, start_retries
from capabilities.calls.start_order import StartTurn
from capabilities.calls.start_ticket import StartTicket
from capabilities.jobs import uploads
from capabilities.jobs.lifecycle import CallIdInUse
from capabilities.lane.lane import current as current_lane
from capabilities.models import Job
from capabilities.protocol import ErrorCode, WireError, responses
from capabilities.work import registry

logger = logging.getLogger(__name__)


class CallRefused(Exception):
    """The call was not started; `error` tells the agent why."""

    def __init__(self, error: WireError) -> None:
        super().__init__(error.message)
        self.error = error


class CallIdTaken(CallRefused):
    """The session already holds another call with this callId."""


class CallIdHeld(CallIdTaken):
    """The session holds this very call already (same callId, same capability and
    params): adopt `job` instead of running it twice.

    A `CallIdTaken` too, carrying its refusal, so a door that never reuses a callId
    (MCP makes its own) refuses it cleanly rather than fails.
    """

    def __init__(self, job: Job) -> None:
        super().__init__(_taken(job.call_id))
        self.job = job


NOT_QUEUED = WireError(
    code=ErrorCode.INTERNAL_ERROR, message="The call could not be queued; try again."
)


@dataclass(frozen=True, kw_only=True)
class CallRequest:
    """A call as any door receives it."""

    session_id: str
    call_id: str
    request_id: str
    capability: str
    params: dict[str, Any]
    params_hash: str = ""
    """`call_digest(capability, params)`, if the door has it; computed if not."""
    timeout_ms: int | None
    progress_token: str | int | None
    notify_started: bool
    generation: int = 0
    """The session generation of the connection starting it: the claim's fence of a row
    written already cancelled and delivered (its cancel won the ticket)."""
    ticket: StartTicket | None = None
    """A cancel's way in while the job is being written (the WebSocket doors)."""
    deliver: lane_runs.Deliver | None = None
    """Answers a local run at once if the door still holds the call (the WebSocket doors)."""
    turn: StartTurn | None = None
    """Its place among its session's starts (the WebSocket doors start several at once)."""
    check: Callable[[], None] | None = None
    """A door's own check, run in the row's database hop just before the row (MCP: its
    session's row is open); raising budgets.Refused refuses the call."""


def capability_names() -> list[str]:
    """Every capability agents may call."""
    return [spec.name for spec in registry.all_specs()]


def max_timeout_ms(principal: Principal, capability: str) -> int:
    """The longest options.timeout this principal may ask of the capability."""
    return principal.max_timeout_ms(_spec(capability).timeouts().max_ms)


async def start(principal: Principal, call: CallRequest) -> Job:
    """Check the call and create its job (queued once committed); CallRefused if not."""
    try:
        if not tracing.enabled():
            return await _start(principal, call)
        with tracing.call_span(
            session_id=call.session_id, call_id=call.call_id, capability=call.capability
        ) as trace_parent:
            return await _start(principal, call, trace_parent)
    finally:
        if call.turn is not None:  # refused before its row was handed over
            call.turn.pass_on()


async def _start(principal: Principal, call: CallRequest, trace_parent: str = "") -> Job:
    spec = _spec(call.capability)
    error = budgets.call_refusal(principal, call.capability, call.params)
    if error is not None:
        raise CallRefused(error)
    # The schema is checked while the rate limiter's answer travels; it still wins.
    limited = asyncio.ensure_future(over_rate_limit(principal))
    invalid = spec.validate(call.params) or uploads.refusal(
        call.session_id, call.capability, call.params
    )
    error = await limited or invalid
    if error is not None:
        raise CallRefused(error)
    timeouts = spec.timeouts()
    default_ms = min(timeouts.default_ms, principal.max_timeout_ms(timeouts.max_ms))
    lane = current_lane()
    if call.turn is not None:
        await call.turn.come()
    taken = lane.takes(call.capability, call.params)
    # Queued for the database thread now, before the next start's (calls/job_writes.py).
    new = job_writes.NewJob(
        principal=principal,
        check=call.check,
        job={
            "session_id": call.session_id,
            "call_id": call.call_id,
            "request_id": call.request_id,
            "capability": call.capability,
            "params": call.params,
            "params_hash": call.params_hash,
            "timeout_ms": call.timeout_ms or default_ms,
            "progress_token": call.progress_token,
            "notify_started": call.notify_started,
            "ticket": call.ticket,
            "generation": call.generation,
            "run_by": lane.name if taken else None,
            **({"trace_parent": trace_parent} if trace_parent else {}),
        },
    )
    writing = job_writes.create(new)
    if call.turn is not None:
        call.turn.pass_on()
    try:
        job = await _written(writing, new, call.call_id)
    except BaseException:
        if taken:
            lane.give_back()
        raise
    if lane.runs(job):
        lane_runs.spawn(job, call.params, call.deliver)  # gives its place back when done
    elif taken:
        lane.give_back()
    return job


async def _written(writing: asyncio.Future[Job], new: job_writes.NewJob, call_id: str) -> Job:
    """The job once its row is written; CallRefused if it was not (CallIdHeld if the
    session holds this very call already)."""
    try:
        return await start_retries.stored(writing, new)
    except job_writes.Unavailable as unavailable:
        raise CallRefused(unavailable.error) from None
    except budgets.Refused as refused:
        raise CallRefused(refused.error) from None
    except CallIdInUse as in_use:
        if in_use.existing is not None:
            raise CallIdHeld(in_use.existing) from None
        raise CallIdTaken(_taken(call_id)) from None
    except Exception:
        logger.exception("Could not create the job of call %s", call_id)
        raise CallRefused(NOT_QUEUED) from None


def _taken(call_id: str) -> WireError:
    return WireError(
        code=ErrorCode.INVALID_PARAMS,
        message=f"callId {call_id!r} was already used in this session.",
        details={"path": "payload.options.callId"},
    )


async def over_rate_limit(principal: Principal) -> WireError | None:
    """RATE_LIMITED (with retryAfter) past the principal's calls per minute."""
    per_minute = principal.calls_per_minute
    wait_ms = await rate_limits.retry_after_ms(principal.rate_limit_id, per_minute)
    if wait_ms is None:
        return None
    return WireError(
        code=ErrorCode.RATE_LIMITED,
        message=f"At most {per_minute} calls per minute; retry after {wait_ms} ms.",
        retry_after_ms=wait_ms,
        details={"limit": "callsPerMinute", "max": per_minute},
    )


def _spec(capability: str) -> registry.CapabilitySpec:
    spec = registry.get(capability)
    if spec is None:
        raise CallRefused(responses.unknown_capability(capability))
    return spec
