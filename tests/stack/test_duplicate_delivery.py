"""A task delivered twice (a redelivery, a restarted worker) never runs its job twice."""

from __future__ import annotations

from functools import partial

from capabilities.models import Job
from capabilities.worker.tasks import run_job
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.stack import Stack
from tests.support.waiting import eventually


def redeliver(job: Job) -> None:
    """Publish the job's task again, as a broker redelivery would."""
    run_job.apply_async(args=(str(job.id),), task_id=f"{job.id}-again")


def skipped(stack: Stack, job_id: str) -> bool:
    """Whether the worker logged that it skipped this job."""
    log = stack.worker.log_text()
    return (
        f"Job {job_id} is no longer queued; skipped" in log
        or f"Job {job_id} was cancelled before it started; skipped" in log
    )


def test_a_running_job_is_not_started_again(stack: Stack, agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 50, "stepMs": 20}, call_id="twice")
    job = wait_running(agent, "twice")
    redeliver(job)
    eventually(lambda: skipped(stack, str(job.id)))
    assert agent.result_of(call)["payload"]["success"] is True
    job.refresh_from_db()
    assert job.worker  # started once, by one worker


def test_settled_and_cancelled_jobs_never_run_again(stack: Stack, agent: Agent) -> None:
    done = agent.call("test.sleep", {"steps": 0}, call_id="finished")
    assert agent.result_of(done)["payload"]["success"] is True
    # Long enough that the cancel always lands before the job could finish.
    queued = agent.call(
        "test.sleep", {"steps": 200, "stepMs": 50}, call_id="cancel-me", timeout_ms=60_000
    )
    agent.cancel("cancel-me")
    assert agent.result_of(queued)["payload"]["cancelled"] is True
    for call_id in ("finished", "cancel-me"):
        job = Job.objects.get(session_id=agent.session_id, call_id=call_id)
        settled_at = job.settled_at
        redeliver(job)
        eventually(partial(skipped, stack, str(job.id)))
        job.refresh_from_db()
        assert job.settled_at == settled_at
    assert len(agent.results_for_call("finished")) == 1
    assert len(agent.results_for_call("cancel-me")) == 1
