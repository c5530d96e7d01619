"""What one principal (an agent key, or a client address) may hold at once.

Counted in the database, so the limits hold across its sessions and every Daphne:
calls in flight (MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL, or a page token's smaller one)
and open sessions (MAX_OPEN_SESSIONS_PER_PRINCIPAL). Checked in the same database
hop that would store the row, before anything is stored. Two connections racing for
the last place can both get it: the limits are a bound on abuse, not a semaphore.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from capabilities.access.principal import Principal
from capabilities.calls import params_size, session_records
from capabilities.calls.start_ticket import StartTicket
from capabilities.jobs import lifecycle, queue
from capabilities.jobs.slot_counts import slot_counts
from capabilities.models import AgentSession, CancelSource, Door, Job
from capabilities.protocol import ErrorCode, Initialize, WireError


class OverBudget(Exception):
    """The principal may not have more; `error` says which limit, for the agent."""

    def __init__(self, error: WireError) -> None:
        super().__init__(error.message)
        self.error = error


def call_refusal(principal: Principal, capability: str, params: dict[str, Any]) -> WireError | None:
    """Why this principal may not make this call at all (no I/O), or None."""
    if not principal.may_call(capability):
        return WireError(
            code=ErrorCode.PERMISSION_DENIED,
            message=f"Page-token connections may not call {capability}; use an agent key.",
            details={"capability": capability},
        )
    limit = principal.max_params_bytes
    if limit is not None and not params_size.json_fits(params, limit):
        return WireError(
            code=ErrorCode.INVALID_PARAMS,
            message=f"Page-token calls may carry at most {limit} bytes of params; "
            "use an agent key for larger ones.",
            details={"path": "params", "limit": limit},
        )
    return None


def create_job(
    principal: Principal,
    ticket: StartTicket | None = None,
    run_by: str | None = None,
    **job: Any,
) -> Job:
    """`jobs.create_job`, unless the principal already has its most calls queued.

    `ticket`: sealed just before the row is written; a cancel that came first has
    the row written settled as cancelled (and delivered: its agent has the answer).
    `run_by`: the local lane that would run it at once, if the principal's share
    has room (calls/local_lane.py).
    """
    # One read serves the budget here and the hand-over decision in create_job.
    counts = slot_counts(queue.queue_for(job["capability"]), principal.rate_limit_id)
    _refuse_at(
        counts.held,
        principal.max_calls_in_flight,
        "callsInFlight",
        "calls of yours may be queued or running at once, across all your sessions; "
        "wait for one to finish.",
        retry_after_ms=settings.ABP["QUEUE_FULL_RETRY_AFTER_MS"],
    )
    cancel_reason = ticket.seal() if ticket is not None else None
    return lifecycle.create_job(
        principal=principal.rate_limit_id,
        max_running=principal.max_concurrent_calls,
        counts=counts,
        run_by=run_by if counts.mine < principal.max_concurrent_calls else None,
        settled=(
            None
            if cancel_reason is None
            else lifecycle.Outcome.cancelled(CancelSource.AGENT, cancel_reason)
        ),
        **job,
    )


def open_session(
    principal: Principal,
    session_id: str,
    message: Initialize,
    *,
    origin: str,
    resume_token: str,
    door: Door,
) -> None:
    """`session_records.open_session`, unless the principal has its most sessions open."""
    refuse_another_session(principal)
    session_records.open_session(
        session_id,
        message,
        origin=origin,
        principal=principal,
        resume_token=resume_token,
        door=door,
    )


def refuse_another_session(principal: Principal) -> None:
    """OverBudget if the principal already has its most sessions open."""
    held = AgentSession.objects.filter(principal=principal.rate_limit_id, closed_at__isnull=True)
    _refuse_at(
        held.count(),
        principal.max_open_sessions,
        "openSessions",
        "sessions of yours may be open at once; shut one down (or let a dropped one expire) first.",
    )


def _refuse_at(
    held: int, limit: int, name: str, what: str, *, retry_after_ms: int | None = None
) -> None:
    """OverBudget (RATE_LIMITED, `details: {limit: name, max}`) once `held` reaches `limit`."""
    if held >= limit:
        raise OverBudget(
            WireError(
                code=ErrorCode.RATE_LIMITED,
                message=f"At most {limit} {what}",
                retry_after_ms=retry_after_ms,
                details={"limit": name, "max": limit},
            )
        )
