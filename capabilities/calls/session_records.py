"""The durable side of a session: its row, and reading what its calls produced."""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any

from django.utils import timezone

from capabilities.access.principal import Principal
from capabilities.endings import resumption
from capabilities.jobs import lifecycle, results
from capabilities.models import ACTIVE_STATUSES, AgentSession, Door, Job
from capabilities.protocol import Initialize


def open_session(
    session_id: str,
    message: Initialize,
    *,
    origin: str,
    principal: Principal,
    resume_token: str,
    door: Door = Door.ABP,
) -> None:
    """Record a new WebSocket session, who opened it, and (hashed) the token that resumes it."""
    record_session(
        session_id,
        principal,
        door=door,
        agent=(message.agent.name, message.agent.version),
        protocol_version=message.protocol_version,
        origin=origin,
        features={
            "notifications": message.features.notifications,
            "progress": message.features.progress,
            "elicitation": message.features.elicitation,
        },
        resume_hash=resumption.token_hash(resume_token),
    )


def record_session(
    session_id: str,
    principal: Principal,
    *,
    door: Door,
    agent: tuple[str, str],
    protocol_version: str,
    origin: str,
    features: dict[str, bool] | None = None,
    resume_hash: str = "",
    per_call: bool = False,
) -> None:
    """Record a new session of any door: who opened it, through which door, from where.

    `per_call`: the row of one session-less call, never counted as an open session.
    """
    AgentSession.objects.create(
        id=session_id,
        door=door,
        agent_name=agent[0][:200],
        agent_version=agent[1][:100],
        protocol_version=protocol_version[:20],
        features=features or {},
        origin=origin[:300],
        agent_key=principal.key,
        auth=principal.kind,
        client_address=principal.client_address[:100],
        principal=principal.rate_limit_id[:120],
        user_id=principal.user_id,
        client=principal.client[:200],
        resume_hash=resume_hash,
        per_call=per_call,
    )


def close_session(session_id: str, reason: str) -> None:
    """Record that the session ended."""
    AgentSession.objects.filter(pk=session_id, closed_at__isnull=True).update(
        closed_at=timezone.now(), close_reason=reason[:300]
    )


def find_job(session_id: str, job_id: str) -> Job | None:
    """A job of this session (never another session's)."""
    return Job.objects.filter(pk=job_id, session_id=uuid.UUID(session_id)).first()


def undelivered_jobs(session_id: str) -> list[Job]:
    """A session's calls not answered yet (in flight, or settled and not sent), oldest first."""
    return list(
        Job.objects.filter(session_id=uuid.UUID(session_id), delivered_at=None).order_by(
            "created_at"
        )
    )


def settled_response(job_id: str, base_url: str) -> dict[str, Any] | None:
    """The call-result of a settled job, or None if it is still active."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None or job.is_active:
        return None
    return results.call_response(job, base_url=base_url)


class NotClaimed(Enum):
    """Why a call-result was not claimed for sending."""

    STILL_ACTIVE = "the job has not settled"
    DELIVERED_ELSEWHERE = "already claimed, by another connection or an earlier note"


def claim_response(
    job_id: str,
    base_url: str,
    response: dict[str, Any] | None,
    *,
    generation: int = 0,
    inline_max_bytes: int | None = None,
) -> dict[str, Any] | NotClaimed:
    """Claim the delivery of a settled job's call-result for a connection of session
    `generation`, and the result to send.

    STILL_ACTIVE if the job has not settled; DELIVERED_ELSEWHERE if the result was
    already claimed (by another connection of the session, or an earlier note).
    `response`, when the worker's note carried it, saves reading the job.
    """
    if not lifecycle.claim_delivery(job_id, generation):
        still_active = Job.objects.filter(pk=job_id, status__in=ACTIVE_STATUSES).exists()
        return NotClaimed.STILL_ACTIVE if still_active else NotClaimed.DELIVERED_ELSEWHERE
    if response is not None:
        return response
    job = Job.objects.get(pk=job_id)
    return results.call_response(job, base_url=base_url, inline_max_bytes=inline_max_bytes)
