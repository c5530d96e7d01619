"""What one principal (an agent key, or a client address) may hold at once.

Counted in the database, so the limits hold across its sessions and every Daphne:
calls in flight (MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL, or a page token's smaller one)
and open sessions (`Principal.max_open_sessions`). Checked in the same database
hop that would store the row, before anything is stored. Two connections racing for
the last place can both get it: the limits are a bound on abuse, not a semaphore.

An open session is one a live Daphne holds or one waiting for a resume; the row of
a session-less MCP call is not one (its call is a call in flight). At the bound, the
principal's longest-idle MCP session with nothing in flight and nothing undelivered
is ended to make room: a key is never locked out by sessions that hold nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from capabilities.access.principal import Principal
from capabilities.calls import session_records
from capabilities.calls.start_ticket import StartTicket
from capabilities.conf import abp_settings
from capabilities.endings import resumption
from capabilities.jobs import lifecycle, queue
from capabilities.jobs.slot_counts import SlotTally
from capabilities.models import AgentSession, CancelSource, Door, Job
from capabilities.protocol import ErrorCode, Initialize, WireError
from capabilities.work import params_size

logger = logging.getLogger(__name__)

MADE_ROOM_REASON = "ended to make room for a new session: idle MCP session, nothing in flight"
# Idle MCP sessions tried, longest-idle first, when another call takes one meanwhile.
_ROOM_CANDIDATES = 5


class Refused(Exception):
    """Refused in the database thread, before the row: `error` says why, for the agent."""

    def __init__(self, error: WireError) -> None:
        super().__init__(error.message)
        self.error = error


class OverBudget(Refused):
    """The principal may not have more; `error` says which limit."""


class NotPermitted(Refused):
    """The call's user lacks a permission the capability requires (access/permissions.py)."""


def call_refusal(principal: Principal, capability: str, params: dict[str, Any]) -> WireError | None:
    """Why this principal may not make this call at all (no I/O), or None."""
    if not principal.may_call(capability):
        if principal.kind == "token":
            missing = list(principal.missing_scopes(capability))
            return WireError(
                code=ErrorCode.PERMISSION_DENIED,
                message=f"This access token lacks the scopes {capability} needs: "
                f"{' '.join(missing)}.",
                details={"capability": capability, "missingScopes": missing},
            )
        if principal.key is not None:
            return WireError(
                code=ErrorCode.PERMISSION_DENIED,
                message=f"This agent key's scopes do not include {capability}.",
                details={"capability": capability, "scopes": list(principal.key.scopes)},
            )
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
    tally: SlotTally | None = None,
    **job: Any,
) -> Job:
    """`jobs.create_job`, unless the principal already has its most calls queued.

    `ticket`: sealed just before the row is written; a cancel that came first has
    the row written settled as cancelled (and delivered: its agent has the answer).
    `run_by`: the local lane that would run it at once, if the principal's share
    has room (lane/lane.py). `tally`: the counts of the batch this job is
    written in (calls/job_writes.py); without one, they are read for this job alone.
    """
    tally = tally or SlotTally()
    # One read serves the budget here and the hand-over decision in create_job.
    counts = tally.counts(queue.queue_for(job["capability"]), principal.rate_limit_id)
    if ticket is None or not ticket.cancelled:
        # A call whose cancel won is written settled: it takes no place in the budget.
        _refuse_at(
            counts.held,
            principal.max_calls_in_flight,
            "callsInFlight",
            "calls of yours may be queued or running at once, across all your sessions; "
            "wait for one to finish.",
            retry_after_ms=abp_settings().QUEUE_FULL_RETRY_AFTER_MS,
        )
    cancel_reason = ticket.seal() if ticket is not None else None
    created = lifecycle.create_job(
        principal=principal.rate_limit_id,
        user_id=principal.user_id,
        client=principal.client,
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
    tally.add(created)
    return created


def open_session(
    principal: Principal,
    session_id: str,
    message: Initialize,
    *,
    origin: str,
    resume_token: str,
    door: Door,
) -> None:
    """`session_records.open_session`, if the principal has (or is given) room for it."""
    make_room_for_session(principal)
    session_records.open_session(
        session_id,
        message,
        origin=origin,
        principal=principal,
        resume_token=resume_token,
        door=door,
    )


def open_sessions(principal: Principal) -> QuerySet[AgentSession]:
    """The principal's sessions that count: held by a live Daphne, or waiting for a resume.

    Not the rows of session-less MCP calls, and not the sessions of a Daphne that is
    gone (nobody refreshes their `seen_at`): a resume is the only way back to those.
    """
    now = timezone.now()
    return AgentSession.objects.filter(
        principal=principal.rate_limit_id, closed_at=None, per_call=False
    ).filter(
        Q(detached_at=None, seen_at__gte=now - resumption.held_lapses_after())
        | Q(detached_at__isnull=False, seen_at__gte=now - resumption.grace())
    )


def make_room_for_session(principal: Principal) -> None:
    """Room for one more session of the principal, or OverBudget (`openSessions`).

    At the bound, the principal's longest-idle MCP session with no call in flight
    and no undelivered result is ended (MADE_ROOM_REASON) and the new one admitted.
    WebSocket sessions are never ended this way: they are live sockets, or resumable.
    """
    limit = principal.max_open_sessions
    counted = open_sessions(principal)
    held = counted.count()
    if held < limit or _end_longest_idle_mcp_session(counted):
        return
    _refuse_at(
        held,
        limit,
        "openSessions",
        "sessions of yours may be open at once, none of them an idle MCP session; "
        "shut one down (or let a dropped one expire) first.",
    )


def _end_longest_idle_mcp_session(counted: QuerySet[AgentSession]) -> bool:
    """End the longest-idle MCP session holding nothing; whether there was one."""
    undelivered = Job.objects.filter(session=OuterRef("pk"), delivered_at=None)
    last_settled = (
        Job.objects.filter(session=OuterRef("pk"), settled_at__isnull=False)
        .order_by("-settled_at")
        .values("settled_at")[:1]
    )
    idle = (
        counted.filter(door=Door.MCP)
        .exclude(Exists(undelivered))
        .annotate(active_at=Coalesce(Subquery(last_settled), F("connected_at")))
        .order_by("active_at")
        .values_list("pk", flat=True)[:_ROOM_CANDIDATES]
    )
    for session_id in list(idle):
        # Conditional: a call that started on it meanwhile keeps the session.
        ended = (
            AgentSession.objects.filter(pk=session_id, closed_at=None)
            .exclude(Exists(undelivered))
            .update(closed_at=timezone.now(), close_reason=MADE_ROOM_REASON)
        )
        if ended:
            logger.info("MCP session %s was ended to make room for a new session", session_id)
            return True
    return False


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
