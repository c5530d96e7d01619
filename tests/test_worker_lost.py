"""A worker process killed mid-job (SIGKILL by PID): the agent still gets an answer."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from capabilities.models import AgentSession, Job, JobStatus
from capabilities.worker import reaper
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")


def test_killed_worker_child_answers_worker_lost(agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 1000, "stepMs": 20}, call_id="doomed")
    job = wait_running(agent, "doomed")
    child_pid = int(job.worker.rsplit(":", 1)[1])
    os.kill(child_pid, signal.SIGKILL)
    payload = agent.result_of(call, timeout=15)["payload"]
    assert payload["success"] is False
    assert payload["error"]["code"] == "WORKER_LOST"
    assert payload["error"]["retryable"] is True
    assert "cancelled" not in payload
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.stopped_at is not None
    # The pool replaced the child: calls still run.
    again = agent.call("test.sleep", {"steps": 1, "stepMs": 1})
    assert agent.result_of(again, timeout=30)["payload"]["success"] is True


def test_running_jobs_keep_a_fresh_heartbeat(agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 300, "stepMs": 20}, call_id="alive")
    job = wait_running(agent, "alive")
    first = job.heartbeat_at
    assert first is not None
    # Beats every second in the tests (WORKER_LOST_AFTER_SECONDS=3): a later one comes.
    eventually(Job.objects.filter(pk=job.pk, heartbeat_at__gt=first).exists, timeout=5)
    agent.cancel("alive")
    assert agent.result_of(call)["payload"]["cancelled"] is True


def test_reaper_fails_a_job_whose_heartbeat_went_stale() -> None:
    stale = timezone.now() - timedelta(seconds=30)
    job = Job.objects.create(
        session=AgentSession.objects.create(agent_name="gone"),
        call_id="stale",
        capability="test.sleep",
        params={},
        status=JobStatus.RUNNING,
        started_at=stale,
        heartbeat_at=stale,
    )
    reaper.reap()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "WORKER_LOST"
    assert job.error_retryable is True
    assert job.stopped_at == stale
