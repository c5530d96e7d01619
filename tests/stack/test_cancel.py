"""Every row of PROTOCOL.md's cancel table, over the real stack (Daphne, Redis, worker)."""

from __future__ import annotations

import functools

from capabilities.conf import abp_settings
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running, wait_stopped, wait_stopped_by_cancel
from tests.support.stack import Stack
from tests.support.waiting import eventually, seconds_between

LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}


def job_of(agent: Agent, call_id: str) -> Job:
    return Job.objects.get(session_id=agent.session_id, call_id=call_id)


def stopped_job(agent: Agent, call_id: str) -> Job | None:
    """The call's job once it is written and its work has stopped (or never started)."""
    return Job.objects.filter(
        session_id=agent.session_id, call_id=call_id, stopped_at__isnull=False
    ).first()


def types_for(agent: Agent, call_id: str) -> list[str]:
    """The order of replies that concern one call."""
    return [
        e["type"]
        for e in agent.inbox
        if e["type"].startswith("capabilities/") and e["payload"].get("callId") == call_id
    ]


def test_cancel_running_call_stops_the_worker_at_a_checkpoint(agent: Agent, stack: Stack) -> None:
    call = agent.call("test.sleep", LONG, call_id="run-1")
    wait_running(agent, "run-1")

    cancel = agent.cancel("run-1", reason="user clicked stop")
    confirmation = agent.reply_to(cancel, "capabilities/cancel-result")
    result = agent.result_of(call)

    assert confirmation["payload"] == {"callId": "run-1", "cancelled": True}
    assert result["payload"]["success"] is False
    assert result["payload"]["cancelled"] is True
    assert result["payload"]["error"]["code"] == "CANCELLED"
    assert types_for(agent, "run-1") == ["capabilities/cancel-result", "capabilities/call-result"]
    job = wait_stopped_by_cancel(stack, agent, "run-1")
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "user clicked stop"
    assert job.started_at is not None
    assert job.settled_at is not None
    assert not job.hard_killed


def test_cancel_running_call_without_checkpoints_interrupts_the_thread(
    agent: Agent, stack: Stack
) -> None:
    call = agent.call("test.sleep", {"mode": "busy", "steps": 1000, "stepMs": 20}, call_id="busy")
    wait_running(agent, "busy")
    agent.cancel("busy")
    assert agent.result_of(call)["payload"]["cancelled"] is True
    # Stopped by raising into the thread: before the 20 s of busy work ended, and not
    # by the kill.
    job = wait_stopped_by_cancel(stack, agent, "busy")
    assert not job.hard_killed


def test_work_that_cannot_be_interrupted_is_killed_after_the_grace_period(
    agent: Agent, stack: Stack
) -> None:
    call = agent.call("test.sleep", {"mode": "block", "steps": 1, "stepMs": 30000}, call_id="blk")
    wait_running(agent, "blk")
    agent.cancel("blk")
    assert agent.result_of(call)["payload"]["cancelled"] is True
    job = wait_stopped(agent, "blk", timeout=15)
    assert job.hard_killed
    # Killed only once the grace period had passed since the cancel (no upper bound: the
    # wait above is the only limit a loaded machine needs).
    grace = abp_settings().HARD_KILL_GRACE_SECONDS
    assert seconds_between(job.settled_at, job.stopped_at) >= grace
    # The pool replaced the killed child: the worker still runs jobs.
    quick = agent.call("test.sleep", {"steps": 1, "stepMs": 1}, call_id="after-kill")
    assert agent.result_of(quick, timeout=30)["payload"]["success"] is True


def test_cancel_queued_call_never_starts_it(stack: Stack, agent: Agent) -> None:
    # Fill both worker slots from another session so the next call waits in the queue.
    with Agent(stack.ws_url) as other:
        other.initialize()
        for n in range(2):
            # Long enough to overlap even if a slot frees late; cancelled below.
            other.call("test.sleep", {"steps": 1500, "stepMs": 20}, call_id=f"fill-{n}")
        eventually(
            lambda: (
                Job.objects.filter(session_id=other.session_id, status=JobStatus.RUNNING).count()
                == 2
            ),
            timeout=30,
        )
        call = agent.call("test.sleep", {"steps": 1, "stepMs": 1}, call_id="queued")
        cancel = agent.cancel("queued")
        assert agent.reply_to(cancel, "capabilities/cancel-result")["payload"]["cancelled"] is True
        assert agent.result_of(call)["payload"]["cancelled"] is True
        for n in range(2):
            other.cancel(f"fill-{n}")
    # A cancel may be answered before the call's row is written (written cancelled).
    job = eventually(Job.objects.filter(session_id=agent.session_id, call_id="queued").first)
    assert job.status == JobStatus.CANCELLED
    assert job.started_at is None
    assert job.stopped_at is not None


def test_cancel_right_behind_its_call_is_confirmed_and_the_call_answered_once(
    agent: Agent,
) -> None:
    # Back to back: the cancel is read while the call's job is being written. It
    # wins either before the row (written cancelled, never sent) or after it.
    pairs = []
    for n in range(10):
        call = agent.call("test.sleep", LONG, call_id=f"behind-{n}")
        pairs.append((call, agent.cancel(f"behind-{n}")))
    for n, (call, cancel) in enumerate(pairs):
        assert agent.reply_to(cancel, "capabilities/cancel-result")["payload"] == {
            "callId": f"behind-{n}",
            "cancelled": True,
        }
        result = agent.result_of(call)["payload"]
        assert result["error"]["code"] == "CANCELLED"
        assert result["error"]["details"] == {"source": "agent"}
    for n in range(10):
        job = eventually(functools.partial(stopped_job, agent, f"behind-{n}"))
        assert job.status == JobStatus.CANCELLED
        assert job.cancel_source == CancelSource.AGENT
        assert job.delivered_at is not None
        assert len(agent.results_for_call(f"behind-{n}")) == 1


def test_cancel_after_completion_changes_nothing(agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 1, "stepMs": 1, "echo": 7}, call_id="done")
    assert agent.result_of(call)["payload"]["data"]["echo"] == 7
    cancel = agent.cancel("done")
    reply = agent.reply_to(cancel, "capabilities/cancel-result")
    assert reply["payload"] == {
        "callId": "done",
        "cancelled": False,
        "reason": "Operation already completed",
    }
    assert len(agent.results_for_call("done")) == 1
    assert job_of(agent, "done").status == JobStatus.SUCCEEDED


def test_cancel_twice_is_idempotent_with_one_result(agent: Agent) -> None:
    call = agent.call("test.sleep", LONG, call_id="twice")
    wait_running(agent, "twice")
    first = agent.cancel("twice")
    second = agent.cancel("twice")
    assert agent.reply_to(first, "capabilities/cancel-result")["payload"]["cancelled"] is True
    assert agent.reply_to(second, "capabilities/cancel-result")["payload"]["cancelled"] is True
    agent.result_of(call)
    # Anything still in flight would have arrived by now.
    third = agent.cancel("twice")
    assert agent.reply_to(third, "capabilities/cancel-result")["payload"]["cancelled"] is True
    assert len(agent.results_for_call("twice")) == 1


def test_cancel_of_unknown_or_foreign_call_is_not_found(stack: Stack, agent: Agent) -> None:
    cancel = agent.cancel("never-called")
    assert agent.reply_to(cancel, "capabilities/cancel-result")["payload"] == {
        "callId": "never-called",
        "cancelled": False,
        "reason": "Operation not found",
    }
    with Agent(stack.ws_url) as other:
        other.initialize()
        call = other.call("test.sleep", {"steps": 20, "stepMs": 20}, call_id="mine")
        attempt = agent.cancel("mine")
        reply = agent.reply_to(attempt, "capabilities/cancel-result")
        assert reply["payload"]["cancelled"] is False
        assert reply["payload"]["reason"] == "Operation not found"
        # The owner's call runs to completion, untouched.
        assert other.result_of(call)["payload"]["success"] is True
    assert agent.results_for_call("mine") == []


def test_cancel_before_initialize_is_refused(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        cancel = agent.cancel("anything")
        reply = agent.reply_to(cancel, "capabilities/cancel-result")
        assert reply["payload"]["error"]["code"] == "NOT_INITIALIZED"


def test_cancel_running_export_pdf(agent: Agent, stack: Stack) -> None:
    pages = "".join(
        f"<section style='page-break-after: always'>Page {n}</section>" for n in range(400)
    )
    call = agent.call("export.pdf", {"html": pages}, call_id="pdf-run")
    wait_running(agent, "pdf-run")
    agent.cancel("pdf-run")
    assert agent.result_of(call)["payload"]["cancelled"] is True
    job = wait_stopped_by_cancel(stack, agent, "pdf-run")
    assert not job.hard_killed


def test_cancel_finished_export_pdf(agent: Agent) -> None:
    call = agent.call("export.pdf", {"html": "<p>short</p>"}, call_id="pdf-done")
    result = agent.result_of(call, timeout=30)
    assert result["payload"]["success"] is True
    assert result["payload"]["data"]["pageCount"] == 1
    cancel = agent.cancel("pdf-done")
    assert agent.reply_to(cancel, "capabilities/cancel-result")["payload"]["cancelled"] is False
