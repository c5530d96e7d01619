"""Redis restarted (killed by PID, started again) mid-job: nothing hangs."""

from __future__ import annotations

from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.stack import Stack, port_open
from tests.support.waiting import eventually


def test_calls_survive_a_redis_restart(stack: Stack, agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 150, "stepMs": 20}, call_id="through-restart")
    eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id="through-restart", status=JobStatus.RUNNING
        ).exists
    )
    stack.redis.kill()
    stack.redis.start(lambda: port_open(stack.redis_port))
    # The call in flight is answered: its result, or a clear retryable error.
    payload = agent.result_of(call, timeout=30)["payload"]
    assert payload["success"] is True or payload["error"]["retryable"] is True
    # The worker reconnected (it used to exit here), and so did everything else.
    later = agent.call("test.sleep", {"steps": 1, "stepMs": 1, "echo": "after"})
    assert agent.result_of(later, timeout=30)["payload"]["data"]["echo"] == "after"
    assert "Unrecoverable error" not in stack.worker.log_text()
    running = agent.call("test.sleep", {"steps": 500, "stepMs": 20}, call_id="cancel-after")
    eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id="cancel-after", status=JobStatus.RUNNING
        ).exists
    )
    agent.cancel("cancel-after")
    assert agent.result_of(running)["payload"]["cancelled"] is True
    stopped = eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id="cancel-after", stopped_at__isnull=False
        ).first
    )
    assert not stopped.hard_killed  # the abort watcher re-subscribed too
