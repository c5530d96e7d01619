"""Waiting on a call's job, as the worker and the reaper move it along."""

from __future__ import annotations

from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.waiting import eventually


def wait_running(agent: Agent, call_id: str, timeout: float = 10.0) -> Job:
    """The call's job, once a worker has started it."""
    return eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id=call_id, status=JobStatus.RUNNING
        ).first,
        timeout,
    )


def wait_stopped(agent: Agent, call_id: str, timeout: float = 10.0) -> Job:
    """The call's job, once its work has stopped (stopped_at recorded)."""
    return eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id=call_id, stopped_at__isnull=False
        ).first,
        timeout,
    )
