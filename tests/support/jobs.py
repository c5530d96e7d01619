"""Waiting on a call's job, as the worker and the reaper move it along."""

from __future__ import annotations

from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.stack import Stack
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


def wait_stopped_by_cancel(stack: Stack, agent: Agent, call_id: str, timeout: float = 10.0) -> Job:
    """The call's job, once the cancel itself stopped its work.

    The worker logs this only when JobAborted ended the work, at a checkpoint or raised
    into its thread: not when the work ran to its end after the cancel, nor when the
    reaper killed the child. No clock involved, so a slow machine cannot fail it.
    """
    job = wait_stopped(agent, call_id, timeout)
    eventually(lambda: f"Job {job.id} stopped on cancel" in stack.worker.log_text(), timeout)
    return job
