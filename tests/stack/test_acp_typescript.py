"""/abp/rpc driven by the official ACP TypeScript SDK (tests/acp_typescript/, run by node).

Each script opens its own WebSocket, prints one JSON report (with every frame sent
and received) and holds the socket until its standard input closes; the test reads
the jobs meanwhile, so the disconnect cannot race the cancel the test looks at. The
node packages come from the committed lock file (`make test` runs `npm ci`).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

import pytest

from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus
from tests.support.node_scripts import node_for, report_of
from tests.support.paths import TESTS
from tests.support.rpc_agent import rpc_url
from tests.support.stack import Stack
from tests.support.waiting import eventually, seconds_between

PACKAGE = TESTS / "acp_typescript"
# A job cancelled while it runs stops at its next checkpoint (every 20 ms here).
STOPPED_WITHIN = 3.0
# What the abort scripts ask for: 500 steps of 20 ms, ten seconds unless cancelled.
LONG_STEPS = 500


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary; a missing one skips these tests, except under CI."""
    return node_for(PACKAGE, "@agentclientprotocol/sdk")


def acp_client(node: str, stack: Stack, script: str, *args: str) -> Any:
    """Run a script; its report, while it holds its socket (closed on the way out)."""
    return report_of(node, PACKAGE, script, args, {"ABP_RPC_URL": rpc_url(stack.ws_url)})


def wire(report: dict[str, Any]) -> str:
    """The frames a script sent and received, one a line, for failure messages."""
    return "\n".join(
        f"{frame['ms']:>6} ms {frame['direction']:>8} {json.dumps(frame['message'])}"
        for frame in report.get("frames", [])
    )


def session_of(report: dict[str, Any]) -> AgentSession:
    """The script's session row, named by initialize's `_meta["abp/sessionId"]`."""
    assert report["sessionId"], wire(report)
    return AgentSession.objects.get(pk=uuid.UUID(report["sessionId"]))


def jobs_of(report: dict[str, Any]) -> list[Job]:
    """The jobs of the script's session, oldest first."""
    return list(Job.objects.filter(session=session_of(report)).order_by("created_at"))


def stopped_by_agent_cancel(report: dict[str, Any]) -> Job:
    """The session's one job, once cancelled by the agent and stopped by its worker."""

    def probe() -> Job | None:
        jobs = jobs_of(report)
        assert len(jobs) == 1, wire(report)
        return jobs[0] if jobs[0].stopped_at is not None else None

    try:
        job = eventually(probe, timeout=STOPPED_WITHIN)
    except TimeoutError:
        pytest.fail(f"the job did not stop: {jobs_of(report)[0].status}\n{wire(report)}")
    assert job.status == JobStatus.CANCELLED, wire(report)
    assert job.cancel_source == CancelSource.AGENT, wire(report)
    # Stopped at a checkpoint, long before the call's ten seconds of work.
    assert seconds_between(job.started_at, job.stopped_at) < STOPPED_WITHIN
    return job


def sent(report: dict[str, Any], method: str) -> list[dict[str, Any]]:
    """The messages the script sent with `method`."""
    return [
        frame["message"]
        for frame in report["frames"]
        if frame["direction"] == "sent" and frame["message"].get("method") == method
    ]


def received(report: dict[str, Any], method: str) -> list[dict[str, Any]]:
    """The notifications the script received with `method`."""
    return [
        frame["message"]
        for frame in report["frames"]
        if frame["direction"] == "received" and frame["message"].get("method") == method
    ]


def assert_initialized(report: dict[str, Any]) -> None:
    """initialize's result as docs/jsonrpc.md has it, and the session on the rpc door."""
    initialized = report["initialized"]
    assert initialized["protocolVersion"] == 1, wire(report)
    assert initialized["agentCapabilities"]["loadSession"] is False
    jobs_meta = initialized["agentCapabilities"]["_meta"]["abp.jobs"]
    assert {"name": "test.sleep", "available": True} in jobs_meta["capabilities"]
    assert initialized["authMethods"] == []
    assert initialized["_meta"]["abp/resumeToken"]
    session = session_of(report)
    assert session.door == Door.RPC
    assert session.agent_name == "abp-acp-typescript-tests"


def assert_cancelled_by_the_sdk(report: dict[str, Any]) -> None:
    """The abort went out as one `$/cancel_request` naming the call's request id."""
    [call] = sent(report, "_abp/call")
    cancels = sent(report, "$/cancel_request")
    assert cancels == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": call["id"]}}
    ], wire(report)
    assert report["requestId"] == call["id"]
    # Progress came for this call's token from the running job (an idle stack starts
    # it at once), and the abort came at the first one.
    assert report["progress"], wire(report)
    first = report["progress"][0]
    assert first["progressToken"] == "p1"
    assert (first["total"], first["stage"]) == (LONG_STEPS, "sleeping"), wire(report)


def assert_server_cancelled(report: dict[str, Any], job: Job) -> None:
    """The server answered the call once, with -32800 CANCELLED naming the call."""
    response = report["serverResponse"]
    assert response is not None, f"no response to the cancelled call\n{wire(report)}"
    assert "result" not in response, wire(report)
    error = response["error"]
    assert error["code"] == -32800, wire(report)
    assert error["data"]["code"] == "CANCELLED", wire(report)
    assert error["data"]["callId"] == job.call_id
    assert isinstance(error["data"]["message"], str)
    assert isinstance(error["data"]["retryable"], bool)
    answers = [
        frame
        for frame in report["frames"]
        if frame["direction"] == "received"
        and frame["message"].get("id") == report["requestId"]
        and "method" not in frame["message"]
    ]
    assert len(answers) == 1, wire(report)


def test_an_aborted_cancellation_signal_cancels_the_job(node: str, stack: Stack) -> None:
    """The SDK's $/cancel_request settles the job and rejects with the server's -32800."""
    with acp_client(node, stack, "abort_on_progress.mjs") as report:
        job = stopped_by_agent_cancel(report)
        assert_initialized(report)

    assert "resolved" not in report, wire(report)
    rejected = report["rejected"]
    assert rejected["requestError"] is True
    assert rejected["code"] == -32800, wire(report)
    # The server's data, not the SDK's: the cancel settled the job first.
    assert rejected["data"]["code"] == "CANCELLED", wire(report)
    assert rejected["data"]["callId"] == job.call_id
    assert report["progress"][0]["callId"] == job.call_id
    assert_cancelled_by_the_sdk(report)
    assert_server_cancelled(report, job)
    assert job.capability == "test.sleep"
    assert report["elapsedMs"] < 10_000


def test_stop_waiting_on_cancel_rejects_at_once_and_still_cancels_the_job(
    node: str, stack: Stack
) -> None:
    """stopWaitingOnCancel: the SDK's own -32800 at once; the server still stops the job."""
    with acp_client(node, stack, "abort_on_progress.mjs", "stop-waiting") as report:
        job = stopped_by_agent_cancel(report)

    assert "resolved" not in report, wire(report)
    rejected = report["rejected"]
    assert rejected["requestError"] is True
    assert rejected["code"] == -32800
    # The SDK's error carries the signal's reason, not the server's data.
    assert rejected["data"] == "the user pressed stop"
    assert_cancelled_by_the_sdk(report)
    # Dropped by the SDK, the server's answer still came, once, as -32800.
    assert_server_cancelled(report, job)
    assert report["elapsedMs"] < 10_000


def test_calls_that_finish_return_their_data_and_progress(node: str, stack: Stack) -> None:
    """A call's result is `{callId, data, metadata}`; a progressToken brings progress."""
    with acp_client(node, stack, "call.mjs") as report:
        plain_job, progress_job = jobs_of(report)
        assert_initialized(report)

    assert "rejected" not in report["plain"], wire(report)
    plain = report["plain"]["resolved"]
    assert plain["callId"] == plain_job.call_id
    assert plain["data"] == {"echo": "hi", "steps": 2}
    assert isinstance(plain["metadata"]["duration"], int | float)
    assert plain_job.status == JobStatus.SUCCEEDED

    assert "rejected" not in report["withProgress"], wire(report)
    with_progress = report["withProgress"]["resolved"]
    assert with_progress["callId"] == progress_job.call_id == "acp-with-progress"
    assert with_progress["data"] == {"echo": {"nested": [1, "two"]}, "steps": 3}
    assert progress_job.status == JobStatus.SUCCEEDED

    # Progress only for the call with a token, and all of it before its answer.
    notifications = received(report, "_abp/progress")
    assert notifications, wire(report)
    assert all(n["params"]["progressToken"] == "p3" for n in notifications), wire(report)
    assert all(n["params"]["callId"] == "acp-with-progress" for n in notifications)
    running = [p for p in report["progress"] if p.get("stage") != "queued"]
    assert [p["progress"] for p in running] == [1, 2, 3], wire(report)
    last = running[-1]
    expected = {"total": 3, "percentage": 100, "stage": "sleeping", "status": "running"}
    assert {key: last.get(key) for key in expected} == expected, wire(report)
    answer_at = next(
        index
        for index, frame in enumerate(report["frames"])
        if frame["direction"] == "received"
        and frame["message"].get("result", {}).get("callId") == "acp-with-progress"
    )
    last_progress_at = max(
        index
        for index, frame in enumerate(report["frames"])
        if frame["direction"] == "received" and frame["message"].get("method") == "_abp/progress"
    )
    assert last_progress_at < answer_at, wire(report)


def test_the_documented_example_cancels_its_export(node: str, stack: Stack) -> None:
    """tests/acp_typescript/example.mjs, shown in docs/jsonrpc.md, does what it says."""
    finished = subprocess.run(
        [node, "example.mjs"],
        check=False,
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "ABP_RPC_URL": rpc_url(stack.ws_url),
            "ABP_KEY": os.environ["ABP_TEST_AGENT_KEY"],
        },
    )

    assert finished.returncode == 0, finished.stderr
    code, error_code, call_id = finished.stdout.split()
    assert (code, error_code) == ("-32800", "CANCELLED"), finished.stdout
    job = Job.objects.get(call_id=call_id, session__door=Door.RPC)
    assert job.capability == "export.pdf"
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.session.door == Door.RPC
    # Cancelled while queued it never starts; started, its worker stops it.
    if job.started_at is not None:
        stopped = eventually(
            Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first,
            timeout=STOPPED_WITHIN,
        )
        assert seconds_between(stopped.started_at, stopped.stopped_at) < 10
