"""A worker process killed mid-job (SIGKILL by PID): the agent still gets an answer."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from capabilities.jobs import lifecycle
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


def test_a_child_killed_under_cancelled_work_records_when_the_work_stopped(agent: Agent) -> None:
    # Cancelled, its work (a blocking sleep) not stopped yet, then its process dies
    # within the grace: the job was settled already, so only its stop is recorded.
    # The reaper's own kill comes 1.5 s after the cancel; a loaded run may let it win
    # that race, which says nothing of the child's death: that round is run again.
    for attempt in range(3):
        job = _killed_under_cancelled_work(agent, f"dies-cancelled-{attempt}")
        if not job.hard_killed:
            break
    assert job.status == JobStatus.CANCELLED
    assert job.hard_killed is False  # not by the reaper's kill: by the child's death
    assert job.settled_at is not None
    assert job.stopped_at is not None
    assert job.stopped_at >= job.settled_at


def _killed_under_cancelled_work(agent: Agent, call_id: str) -> Job:
    params = {"mode": "block", "steps": 1, "stepMs": 30_000}
    call = agent.call("test.sleep", params, call_id=call_id)
    job = wait_running(agent, call_id)
    agent.cancel(call_id)
    assert agent.result_of(call)["payload"]["cancelled"] is True
    os.kill(int(job.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    stopped = Job.objects.filter(pk=job.pk, stopped_at__isnull=False)
    eventually(stopped.exists, timeout=10)
    job.refresh_from_db()
    return job


def cancelled_job(*, heartbeat_at: datetime | None, stopped_at: datetime | None = None) -> Job:
    started = timezone.now() - timedelta(seconds=60)
    return Job.objects.create(
        session=AgentSession.objects.create(agent_name="gone"),
        call_id=f"c-{time.monotonic_ns()}",
        capability="test.sleep",
        params={},
        status=JobStatus.CANCELLED,
        started_at=started,
        settled_at=started,
        heartbeat_at=heartbeat_at,
        stopped_at=stopped_at,
    )


def test_cancelled_work_beats_on_until_it_stops() -> None:
    before = timezone.now() - timedelta(seconds=30)
    running_on = cancelled_job(heartbeat_at=before)
    lifecycle.heartbeat(str(running_on.pk))
    running_on.refresh_from_db()
    assert running_on.heartbeat_at is not None
    assert running_on.heartbeat_at > before
    stopped = cancelled_job(heartbeat_at=before, stopped_at=before)
    lifecycle.heartbeat(str(stopped.pk))
    lifecycle.heartbeat_all([str(stopped.pk)])
    stopped.refresh_from_db()
    assert stopped.heartbeat_at == before


def test_the_reaper_records_the_stop_of_cancelled_work_whose_beat_went_stale() -> None:
    # A worker SIGKILLed under cancelled work tells nobody: its beat stops with it.
    stale = timezone.now() - timedelta(seconds=30)
    gone = cancelled_job(heartbeat_at=stale)
    beating = cancelled_job(heartbeat_at=timezone.now())
    reaper.reap()
    gone.refresh_from_db()
    beating.refresh_from_db()
    assert gone.stopped_at == stale
    assert gone.status == JobStatus.CANCELLED
    assert beating.stopped_at is None
