"""The durable side of a session: its row, and reading what its calls produced."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from capabilities import jobs, results
from capabilities.models import AgentSession, CancelSource, Job
from capabilities.protocol import Initialize
from capabilities.ws_auth import Principal


def open_session(
    session_id: str, message: Initialize, *, origin: str, principal: Principal
) -> None:
    """Record a new session, and who opened it."""
    AgentSession.objects.create(
        id=session_id,
        agent_name=message.agent.name[:200],
        agent_version=message.agent.version[:100],
        protocol_version=message.protocol_version[:20],
        features={
            "notifications": message.features.notifications,
            "progress": message.features.progress,
            "elicitation": message.features.elicitation,
        },
        origin=origin[:300],
        agent_key=principal.key,
        auth=principal.kind,
        client_address=principal.client_address[:100],
    )


def close_session(session_id: str, reason: str) -> None:
    """Record that the session ended."""
    AgentSession.objects.filter(pk=session_id, closed_at__isnull=True).update(
        closed_at=timezone.now(), close_reason=reason[:300]
    )


def settled_response(job_id: str, base_url: str) -> dict[str, Any] | None:
    """The call-result of a settled job, or None if it is still active."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None or job.is_active:
        return None
    return results.call_response(job, base_url=base_url)


def settle_cancelled(job_ids: list[str], source: CancelSource, reason: str) -> dict[str, bool]:
    """Settle several jobs as cancelled (shutdown, disconnect); which settles won."""
    outcome = jobs.Outcome.cancelled(source, reason)
    return {job_id: jobs.settle(job_id, outcome) for job_id in job_ids}


def after_cancel(job_id: str, *, delivered: bool) -> None:
    """Off the reply path: revoke the task and record delivery."""
    jobs.revoke(job_id)
    if delivered:
        jobs.mark_delivered(job_id)
