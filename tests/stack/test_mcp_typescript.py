"""/mcp driven by the official MCP TypeScript SDK (tests/mcp_typescript/, run by node).

Each script opens its own MCP session, prints one JSON report and holds the
session until its standard input closes; the test reads the jobs meanwhile, so
the session's end cannot race the cancel the test looks at. The node packages come
from the committed lock file (`make test` runs `npm ci`).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.models import AgentKey, AgentSession, CancelSource, Door, Job, JobStatus
from tests.support.node_scripts import node_for, report_of
from tests.support.paths import TESTS
from tests.support.stack import Stack
from tests.support.waiting import eventually

PACKAGE = TESTS / "mcp_typescript"
# A job cancelled while it runs stops at its next checkpoint (every 20 ms here).
STOPPED_WITHIN = 3.0


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary; a missing one skips these tests, except under CI."""
    return node_for(PACKAGE, "@modelcontextprotocol/sdk")


def mcp_client(node: str, stack: Stack, script: str, *args: str, key: str | None = None) -> Any:
    """Run a script; its report, while it holds its session (DELETE /mcp on the way out)."""
    env = {"ABP_MCP_URL": f"{stack.http_url}/mcp"}
    if key is not None:
        env["ABP_AGENT_KEY"] = key
    return report_of(node, PACKAGE, script, args, env)


def jobs_of(report: dict[str, Any]) -> list[Job]:
    """The jobs of the script's MCP session, oldest first."""
    session_id = uuid.UUID(hex=report["sessionId"])
    return list(Job.objects.filter(session_id=session_id).order_by("created_at"))


def stopped_by_agent_cancel(report: dict[str, Any]) -> Job:
    """The session's one job, once cancelled by the agent and stopped by its worker."""

    def probe() -> Job | None:
        jobs = jobs_of(report)
        assert len(jobs) == 1
        return jobs[0] if jobs[0].stopped_at is not None else None

    job = eventually(probe, timeout=STOPPED_WITHIN)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    return job


def session_ended(report: dict[str, Any]) -> AgentSession:
    """The script's session row, once DELETE /mcp has ended it."""
    session_id = uuid.UUID(hex=report["sessionId"])
    return eventually(
        AgentSession.objects.filter(pk=session_id, closed_at__isnull=False).first, timeout=5
    )


def test_tools_are_listed_and_a_markdown_call_returns_structured_html(
    node: str, stack: Stack
) -> None:
    with mcp_client(node, stack, "list_and_call.mjs") as report:
        [job] = jobs_of(report)

    names = [tool["name"] for tool in report["tools"]]
    assert {"convert.markdownToHtml", "export.pdf", "process.image", "test.sleep"} <= set(names)
    assert all(tool["hasInputSchema"] for tool in report["tools"])
    assert all(isinstance(tool["available"], bool) for tool in report["tools"])
    result = report["result"]
    assert result["isError"] is False
    assert "<h1>Hello</h1>" in result["structuredContent"]["html"]
    assert "<em>TypeScript</em>" in result["structuredContent"]["html"]
    assert job.capability == "convert.markdownToHtml"
    assert job.status == JobStatus.SUCCEEDED
    session = session_ended(report)
    assert session.door == Door.MCP
    assert session.agent_name == "abp-mcp-typescript-tests"


def test_an_abort_after_the_first_progress_cancels_the_job(node: str, stack: Stack) -> None:
    with mcp_client(node, stack, "abort_on_progress.mjs") as report:
        job = stopped_by_agent_cancel(report)

    assert "resolved" not in report
    assert "the user pressed stop" in report["rejected"]["message"]
    assert len(report["progress"]) >= 1
    assert report["progress"][0]["total"] == 500
    # Stopped at a checkpoint, long before the call's 10 s of work.
    assert job.started_at is not None
    assert job.stopped_at is not None
    assert (job.stopped_at - job.started_at).total_seconds() < STOPPED_WITHIN
    assert report["elapsedMs"] < 10_000
    session_ended(report)


def test_progress_resets_the_timeout_when_asked(node: str, stack: Stack) -> None:
    with mcp_client(node, stack, "timeout_with_progress.mjs", "reset") as report:
        [job] = jobs_of(report)

    assert "rejected" not in report, report["rejected"]
    assert report["resolved"]["structuredContent"]["steps"] == 20
    assert report["elapsedMs"] >= 2000
    assert len(report["progress"]) >= 10
    assert job.status == JobStatus.SUCCEEDED


def test_without_reset_the_timeout_cancels_the_job(node: str, stack: Stack) -> None:
    with mcp_client(node, stack, "timeout_with_progress.mjs") as report:
        job = stopped_by_agent_cancel(report)

    assert "resolved" not in report
    # McpError RequestTimeout (-32001), raised by the SDK's own timer.
    assert report["rejected"]["code"] == -32001
    assert "timed out" in report["rejected"]["message"]
    # Well before the call's 2 s of work.
    assert report["elapsedMs"] < 2000
    assert len(report["progress"]) < 20
    assert job.settled_at is not None


def test_the_experimental_tasks_client_cancels_a_task_with_tasks_cancel(
    node: str, stack: Stack
) -> None:
    with mcp_client(node, stack, "tasks_cancel.mjs") as report:
        job = Job.objects.get(pk=uuid.UUID(report["taskId"]))
        # tasks/cancel answered once the job was settled: read right after, it is.
        assert report["cancelled"]["status"] == "cancelled"
        assert report["afterCancel"]["status"] == "cancelled"
        assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
        done = eventually(lambda: Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first())

    assert done.stopped_at is not None
    # A cancelled task stays cancelled: cancelling it again is -32602.
    assert report["secondCancel"]["rejected"]["code"] == -32602
    assert report["messages"][0]["type"] == "taskCreated"


# -- the v2 client (@modelcontextprotocol/client), both eras ----------------------------


@pytest.mark.parametrize(("mode", "version"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_the_v2_clients_concurrent_calls_all_run_and_its_abort_stops_the_job(
    node: str, stack: Stack, mode: str, version: str
) -> None:
    count = 20
    # A key that may hold two sessions: twenty calls in flight are never sessions.
    key, plaintext = agent_keys.create_key(f"v2 client {mode}")
    AgentKey.objects.filter(pk=key.pk).update(max_open_sessions=2)
    since = timezone.now()
    with mcp_client(node, stack, "client_v2.mjs", mode, str(count), key=plaintext) as report:
        assert report["protocolVersion"] == version
        # Never refused for sessions: every call ran, each with its own answer.
        assert [result.get("code") for result in report["results"]] == [None] * count
        htmls = sorted(result["html"] for result in report["results"])
        assert htmls == sorted(f"<h1>Call {n}</h1>" for n in range(count))
        assert report["progressed"] is True
        assert report["aborted"] is not None
        sleep_jobs = Job.objects.filter(capability="test.sleep", created_at__gte=since)
        job = eventually(lambda: sleep_jobs.filter(stopped_at__isnull=False).first(), timeout=5)
        assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
