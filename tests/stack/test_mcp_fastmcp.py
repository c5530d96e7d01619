"""FastMCP's client (fastmcp 4.1) on the real stack: both wires, and SEP-2663 tasks.

Importing `fastmcp_tasks` makes every FastMCP `Client` declare the tasks extension
on 2026-07-28. Its `call_tool` always asks for progress, so it stays a plain call
(progress on the stream, a timeout closes it and cancels the job); `call_tool_task`
asks for none, so it is a task the client polls and cancels.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp_tasks import ToolTask, call_tool_task
from mcp.shared.exceptions import MCPError

from capabilities.access import agent_keys
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.mcp_clients import MODERN_VERSION, suite_key
from tests.support.stack import Stack
from tests.support.waiting import eventually, eventually_async, in_thread

pytestmark = pytest.mark.usefixtures("database")

MODES = ["legacy", MODERN_VERSION]
LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}  # ten seconds, unless cancelled


@contextlib.asynccontextmanager
async def fastmcp_client(
    stack: Stack, mode: str = MODERN_VERSION, key: str | None = None
) -> AsyncIterator[Client[Any]]:
    headers = {"Authorization": f"Bearer {key or suite_key()}"}
    transport = StreamableHttpTransport(f"{stack.http_url}/mcp", headers=headers)
    async with Client(transport, mode=mode) as client:
        yield client


def job_echoing(echo: str) -> Job:
    return eventually(lambda: Job.objects.filter(params__echo=echo).first())


@pytest.mark.parametrize("mode", MODES)
def test_list_call_and_progress(stack: Stack, mode: str) -> None:
    found: dict[str, Any] = {}
    reports: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total))

    async def scenario() -> None:
        async with fastmcp_client(stack, mode) as client:
            found["version"] = client.protocol_version
            found["tools"] = {tool.name for tool in await client.list_tools()}
            arguments = {"mode": "checkpoint", "steps": 5, "stepMs": 20, "echo": "fast"}
            found["result"] = await client.call_tool(
                "test.sleep", arguments, progress_handler=on_progress
            )

    anyio.run(scenario)
    assert found["version"] == ("2025-11-25" if mode == "legacy" else MODERN_VERSION)
    assert {"test.sleep", "export.pdf", "convert.markdownToHtml"} <= found["tools"]
    assert found["result"].structured_content == {"echo": "fast", "steps": 5}
    assert reports
    assert reports[-1] == (5, 5)
    assert [progress for progress, _ in reports] == sorted({progress for progress, _ in reports})


@pytest.mark.parametrize("mode", MODES)
def test_a_client_timeout_cancels_the_job(stack: Stack, mode: str) -> None:
    echo = str(uuid.uuid4())

    async def scenario() -> None:
        async with fastmcp_client(stack, mode) as client:
            with pytest.raises(MCPError):
                await client.call_tool("test.sleep", {**LONG, "echo": echo}, timeout=1)
            # The session stays open until the cancel has landed: ending it at once
            # would race the cancel with the session's end (a disconnect).
            ended = Job.objects.filter(params__echo=echo, status=JobStatus.CANCELLED)
            await eventually_async(ended.first)

    anyio.run(scenario)
    job = job_echoing(echo)
    done = eventually(
        lambda: Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first(), timeout=5
    )
    assert (done.status, done.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    assert not done.call_id.startswith("mcp-task:")  # a plain call, not a task


def test_a_tool_task_runs_to_its_result(stack: Stack) -> None:
    found: dict[str, Any] = {}
    arguments = {"mode": "checkpoint", "steps": 5, "stepMs": 20, "echo": "tasked"}

    async def scenario() -> None:
        async with fastmcp_client(stack) as client:
            task = await call_tool_task(client, "test.sleep", arguments)
            found["created"] = task.create_result
            found["result"] = await task.result()
            found["status"] = await task.status()

    anyio.run(scenario)
    created = found["created"]
    assert (created.status, created.poll_interval_ms) == ("working", 1000)
    assert found["result"].structured_content == {"echo": "tasked", "steps": 5}
    assert found["status"].status == "completed"
    job = Job.objects.get(pk=created.task_id)
    assert (job.status, job.capability) == (JobStatus.SUCCEEDED, "test.sleep")


def test_a_cancelled_tool_task_stops_and_another_key_cannot_touch_it(stack: Stack) -> None:
    found: dict[str, Any] = {}
    echo = str(uuid.uuid4())

    async def scenario() -> None:
        other_key = await in_thread(lambda: agent_keys.create_key("fastmcp other")[1])
        async with fastmcp_client(stack) as client, fastmcp_client(stack, key=other_key) as other:
            task = await call_tool_task(client, "test.sleep", {**LONG, "echo": echo})
            running = Job.objects.filter(pk=task.task_id, status=JobStatus.RUNNING)
            await eventually_async(running.first)
            # The same task, driven by a client of another key.
            stranger = ToolTask(other, "test.sleep", task.create_result)
            for attempt in (stranger.status, stranger.cancel):
                with pytest.raises(MCPError, match="Unknown task") as raised:
                    await attempt()
                found.setdefault("foreign", []).append(raised.value.error.code)
            found["still"] = await task.status()
            await task.cancel()
            found["at_ack"] = await in_thread(lambda: Job.objects.get(pk=task.task_id))
            found["after"] = await task.status()
            with pytest.raises(ToolError, match="cancelled"):
                await task.result()

    anyio.run(scenario)
    assert found["foreign"] == [-32602, -32602]
    assert found["still"].status == "working"
    at_ack = found["at_ack"]
    assert (at_ack.status, at_ack.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    assert found["after"].status == "cancelled"
    done = eventually(
        lambda: Job.objects.filter(pk=at_ack.pk, stopped_at__isnull=False).first(), timeout=5
    )
    assert done.status == JobStatus.CANCELLED
