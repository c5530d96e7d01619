"""Calls over the real stack: results, errors, progress, notifications, timeouts."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from capabilities.jobs import lifecycle as jobs
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_stopped
from tests.support.stack import Stack
from tests.support.waiting import eventually, seconds_between


@pytest.fixture
def agent(stack: Stack) -> Iterator[Agent]:
    connected = Agent(stack.ws_url)
    connected.initialize(notifications=True)
    yield connected
    connected.close()


def test_result_carries_data_and_duration(agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 3, "stepMs": 10, "echo": {"a": [1, 2]}})
    payload = agent.result_of(call)["payload"]
    assert payload["success"] is True
    assert payload["data"] == {"echo": {"a": [1, 2]}, "steps": 3}
    assert payload["metadata"]["duration"] >= 30
    # The server generated a callId for a call that had none.
    assert len(payload["callId"]) == 36


def test_call_id_at_top_of_payload_is_accepted(agent: Agent) -> None:
    message_id = agent.send(
        "capabilities/call",
        {"capability": "test.sleep", "params": {"steps": 0}, "callId": "top-level"},
    )
    assert agent.result_of(message_id)["payload"]["callId"] == "top-level"


def test_export_pdf_returns_inline_document(agent: Agent) -> None:
    html = "".join(f"<p style='page-break-after: always'>{n}</p>" for n in range(3))
    call = agent.call("export.pdf", {"html": html, "options": {"pageSize": "letter"}})
    data = agent.result_of(call, timeout=30)["payload"]["data"]
    assert data["pageCount"] == 3
    document = data["document"]
    assert document["mimeType"] == "application/pdf"
    assert document["encoding"] == "base64"
    assert document["filename"].endswith(".pdf")
    pdf = base64.b64decode(document["content"])
    assert pdf.startswith(b"%PDF-")
    assert document["size"] == len(pdf)


def test_progress_and_notifications(agent: Agent) -> None:
    call = agent.call(
        "test.sleep", {"steps": 3, "stepMs": 10}, call_id="prog", progress_token="tok-1"
    )
    agent.result_of(call)
    progress = [e["payload"] for e in agent.inbox if e["type"] == "progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert all(p["operationId"] == "tok-1" and p["total"] == 3 for p in progress)
    assert progress[-1]["percentage"] == 100.0
    events = [
        e["payload"]["event"]
        for e in agent.inbox
        if e["type"] == "notification" and e["payload"]["data"].get("operationId") == "prog"
    ]
    assert events == ["notifications/operation/started", "notifications/operation/completed"]


def test_no_progress_without_a_token(agent: Agent) -> None:
    agent.result_of(agent.call("test.sleep", {"steps": 3, "stepMs": 5}))
    assert not [e for e in agent.inbox if e["type"] == "progress"]


def test_capability_error_has_its_code(agent: Agent) -> None:
    payload = agent.result_of(agent.call("test.sleep", {"steps": 1, "mode": "fail"}))["payload"]
    assert payload["success"] is False
    assert payload["error"]["code"] == "INVALID_PARAMS"
    assert payload["error"]["details"] == {"path": "params.mode"}
    assert "cancelled" not in payload


def test_crash_is_reported_without_traceback(agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 1, "mode": "crash"}, call_id="crash")
    payload = agent.result_of(call)["payload"]
    assert payload["error"]["code"] == "OPERATION_FAILED"
    assert "Traceback" not in str(payload)
    assert "asked to crash" not in str(payload)
    job = Job.objects.get(session_id=agent.session_id, call_id="crash")
    assert "asked to crash" in job.error_traceback


def test_params_are_validated_before_a_job_exists(agent: Agent) -> None:
    wrong_type = agent.call("test.sleep", {"steps": "many"}, call_id="bad-type")
    payload = agent.result_of(wrong_type)["payload"]
    assert payload["error"]["code"] == "INVALID_TYPE"
    assert payload["error"]["details"]["path"] == "params.steps"
    missing = agent.call("export.pdf", {"options": {}}, call_id="bad-missing")
    assert agent.result_of(missing)["payload"]["error"]["code"] == "MISSING_PARAM"
    unknown = agent.call("no.such.thing", {}, call_id="bad-unknown")
    assert agent.result_of(unknown)["payload"]["error"]["code"] == "UNKNOWN_CAPABILITY"
    assert not Job.objects.filter(session_id=agent.session_id, call_id__startswith="bad-").exists()


def test_reusing_a_call_id_is_invalid(agent: Agent) -> None:
    first = agent.call("test.sleep", {"steps": 50, "stepMs": 20}, call_id="dup")
    second = agent.call("test.sleep", {"steps": 1}, call_id="dup")
    assert agent.result_of(second)["payload"]["error"]["code"] == "INVALID_PARAMS"
    agent.cancel("dup")
    assert agent.result_of(first)["payload"]["cancelled"] is True
    third = agent.call("test.sleep", {"steps": 1}, call_id="dup")
    assert agent.result_of(third)["payload"]["error"]["code"] == "INVALID_PARAMS"
    assert len([r for r in agent.results_for_call("dup") if r["id"] == first]) == 1


def test_timeout_ends_the_call_as_cancelled(agent: Agent) -> None:
    # Stopped at its next checkpoint once timed out: the test never waits for the work.
    work_seconds = 30
    params = {"steps": work_seconds * 50, "stepMs": 20}
    call = agent.call("test.sleep", params, call_id="slow", timeout_ms=300)
    payload = agent.result_of(call)["payload"]
    assert payload["cancelled"] is True
    assert payload["error"]["code"] == "TIMEOUT"
    assert payload["error"]["retryable"] is True
    job = wait_stopped(agent, "slow")
    assert job.cancel_source == CancelSource.TIMEOUT
    # Not before the deadline; long before the work would have ended (no tight bound: on
    # a loaded machine the timer may fire late).
    assert 0.25 < seconds_between(job.created_at, job.settled_at) < work_seconds / 2


def test_timeout_is_enforced_without_any_agent(stack: Stack) -> None:
    # A job whose session has no consumer: only the worker's limits and the reaper
    # can end it.
    session = AgentSession.objects.create(agent_name="gone")
    job = jobs.create_job(
        session_id=str(session.id),
        call_id="orphan",
        request_id="r1",
        capability="test.sleep",
        params={"steps": 3000, "stepMs": 20},  # 60 s of work
        timeout_ms=500,
        progress_token=None,
    )
    ended = eventually(
        lambda: Job.objects.filter(pk=job.id, stopped_at__isnull=False).first(), timeout=30
    )
    assert ended.status == JobStatus.CANCELLED
    assert ended.cancel_source == CancelSource.TIMEOUT
    assert ended.error_code == "TIMEOUT"
    # Ended by the timeout, long before the work would have (no tight bound: a loaded
    # machine may run the reaper late).
    assert seconds_between(ended.created_at, ended.settled_at) < 30
