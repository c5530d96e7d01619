"""A job that asks for more memory than a worker child may have fails alone, coded.

The suite's worker children are capped at ABP_WORKER_MEMORY_LIMIT_MB (1024 MiB in
tests/support/environment.py); the bombs ask for 512 MiB more, which the machine
could give, so without the ceiling they would succeed.
"""

from __future__ import annotations

from pathlib import Path

from capabilities.conf import abp_settings
from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.stack import Stack
from tests.support.waiting import eventually

LIMIT_MB = abp_settings().WORKER_MEMORY_LIMIT_MB
BOMB_MB = LIMIT_MB + 512


def child_pid(job: Job) -> int:
    """The worker child that ran a job (its `worker` is `<hostname>:<pid>`)."""
    return int(job.worker.rsplit(":", 1)[1])


def busy_child(agent: Agent) -> tuple[str, int]:
    """Keep one of the worker's two children busy, so the next job goes to the other."""
    call = agent.call("test.sleep", {"steps": 3000, "stepMs": 20}, call_id="hold")
    return call, child_pid(wait_running(agent, "hold"))


def test_python_allocation_over_the_limit_fails_coded_and_its_child_is_replaced(
    agent: Agent, stack: Stack
) -> None:
    assert 0 < LIMIT_MB < BOMB_MB <= 3072
    hold, other = busy_child(agent)
    bomb = agent.call("test.allocate", {"mb": BOMB_MB}, call_id="bomb")
    payload = agent.result_of(bomb, timeout=60)["payload"]
    assert payload["success"] is False
    assert payload["error"] == {
        "code": "OPERATION_FAILED",
        "message": f"The operation ran out of memory (limit {LIMIT_MB} MiB).",
        "retryable": False,
        "details": {"limit": "workerMemoryMb", "max": LIMIT_MB},
    }
    job = Job.objects.get(session_id=agent.session_id, call_id="bomb")
    assert "MemoryError" in job.error_traceback
    bombed = child_pid(job)
    assert bombed != other
    # The child leaves once the task is reported; Celery then sees it as a lost
    # worker, and cancellation.fail_lost finds the job already settled.
    eventually(lambda: not Path(f"/proc/{bombed}").exists(), timeout=30)
    eventually(lambda: "WorkerLostError" in stack.worker.log_text(), timeout=30)
    # A fresh child takes the next job (the other one is still busy).
    after = agent.call("test.allocate", {"mb": 64}, call_id="after")
    assert agent.result_of(after, timeout=60)["payload"]["success"] is True
    assert child_pid(Job.objects.get(session_id=agent.session_id, call_id="after")) not in {
        bombed,
        other,
    }
    # The bomb was answered once, as it first settled.
    assert len(agent.results_for_call("bomb")) == 1
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "OPERATION_FAILED")
    agent.cancel("hold")
    assert agent.result_of(hold)["payload"]["cancelled"] is True


def test_c_library_aborting_on_a_failed_allocation_answers_worker_lost(agent: Agent) -> None:
    call = agent.call("test.allocate", {"mb": BOMB_MB, "via": "glib"}, call_id="glib-bomb")
    payload = agent.result_of(call, timeout=60)["payload"]
    assert payload["success"] is False
    assert payload["error"]["code"] == "WORKER_LOST"
    assert payload["error"]["retryable"] is True
    # The pool replaced the child: calls still run.
    again = agent.call("test.allocate", {"mb": 64})
    assert agent.result_of(again, timeout=60)["payload"]["success"] is True
