"""Redis restarted (killed by PID, started again) mid-job: nothing hangs."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running, wait_stopped
from tests.support.stack import Stack, port_open
from tests.support.waiting import eventually


def test_calls_survive_a_redis_restart(stack: Stack, agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 150, "stepMs": 20}, call_id="through-restart")
    wait_running(agent, "through-restart")
    stack.redis.kill()
    stack.redis.start(lambda: port_open(stack.redis_port))
    # The call in flight is answered: its result, or a clear retryable error.
    payload = agent.result_of(call, timeout=30)["payload"]
    assert payload["success"] is True or payload["error"]["retryable"] is True
    # The worker reconnected (it used to exit here), and so did everything else.
    later = agent.call("test.sleep", {"steps": 1, "stepMs": 1, "echo": "after"})
    answer = agent.result_of(later, timeout=30)["payload"]
    assert answer.get("data", {}).get("echo") == "after", answer
    assert "Unrecoverable error" not in stack.worker.log_text()
    running = agent.call("test.sleep", {"steps": 500, "stepMs": 20}, call_id="cancel-after")
    wait_running(agent, "cancel-after")
    agent.cancel("cancel-after")
    assert agent.result_of(running)["payload"]["cancelled"] is True
    stopped = wait_stopped(agent, "cancel-after")
    assert not stopped.hard_killed  # the abort watcher re-subscribed too


def test_sessions_open_and_resume_after_a_redis_restart(stack: Stack) -> None:
    held = Agent(stack.ws_url)
    payload = held.initialize()["payload"]
    stack.redis.kill()
    stack.redis.start(lambda: port_open(stack.redis_port))
    # The first channel-layer calls after the restart meet dead pooled connections:
    # joining a new session's group, and announcing a takeover to the old socket.
    with Agent(stack.ws_url) as fresh:
        assert fresh.initialize()["payload"]["sessionId"]
        call = fresh.call("test.sleep", {"steps": 1, "echo": "fresh"})
        answer = fresh.result_of(call, timeout=30)["payload"]
        assert answer.get("data", {}).get("echo") == "fresh", answer
    with Agent(stack.ws_url) as taker:
        reply = taker.resume(payload["sessionId"], payload["resumeToken"])["payload"]
        assert reply["sessionId"] == payload["sessionId"]
    held.close()


def test_jobs_handed_over_before_a_redis_restart_are_handed_over_again_at_once(
    stack: Stack, agent: Agent
) -> None:
    template = agent.call("test.sleep", {"steps": 1}, call_id="template")
    assert agent.result_of(template)["payload"]["success"] is True
    like = Job.objects.get(session_id=agent.session_id, call_id="template")
    # Handed to Celery, its message still in Redis's queue when Redis went: lost.
    lost = Job.objects.create(
        session_id=agent.session_id,
        call_id="message-lost",
        capability=like.capability,
        params={"steps": 1, "echo": "lost"},
        principal=like.principal,
        queue=like.queue,
        max_running=like.max_running,
        deadline=timezone.now() + timedelta(minutes=5),
        dispatched_at=timezone.now(),
    )
    stack.redis.kill()
    stack.redis.start(lambda: port_open(stack.redis_port))
    # The first worker to announce itself to the emptied Redis hands it over again,
    # well before REDISPATCH_AFTER_SECONDS (30 s).
    done = eventually(
        Job.objects.filter(pk=lost.pk, status=JobStatus.SUCCEEDED).first,
        timeout=15,
    )
    assert done.result == {"echo": "lost", "steps": 1}
    assert "may have lost" in stack.worker.log_text() + stack.small_worker.log_text()
