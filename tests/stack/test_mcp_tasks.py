"""MCP tasks (2025-11-25) on the real stack: a task-augmented `tools/call` is a job.

The official Python client (mcp 2.3.0) checks every `tools/call` answer against
`CallToolResult`, so it cannot read a `CreateTaskResult`: tasks are created and
driven over raw HTTP on the 2025 wire; the client checks what it can see.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY

from capabilities.access import agent_keys
from capabilities.conf import abp_settings
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.mcp_clients import TASKS_EXTENSION, RawSession, official_client
from tests.support.stack import Stack
from tests.support.waiting import eventually_async, in_thread

pytestmark = pytest.mark.usefixtures("database")

LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}  # ten seconds, unless cancelled
SHORT = {"mode": "checkpoint", "steps": 3, "stepMs": 10, "echo": "done"}
RELATED_TASK = "io.modelcontextprotocol/related-task"
INVALID_PARAMS = -32602
_ids = itertools.count(1)


def url_of(stack: Stack) -> str:
    return f"{stack.http_url}/mcp"


def fresh_key() -> str:
    """A key of its own: a task belongs to its key (or its user), in any of its sessions,
    and the suite's key has made tasks in other tests."""
    return agent_keys.create_key("mcp tasks")[1]


def raw(
    stack: Stack, scenario: Callable[..., Awaitable[None]], sessions: int = 1, keys: int = 1
) -> None:
    """Run `scenario` with `sessions` open MCP sessions (2025-11-25) of each of `keys` fresh
    keys, ended after it."""
    made = [fresh_key() for _ in range(keys)]

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            opened = [RawSession(http, url_of(stack), key) for key in made for _ in range(sessions)]
            try:
                for session in opened:
                    await session.open()
                await scenario(*opened)
            finally:
                for session in opened:
                    await session.close()

    anyio.run(main)


async def rpc(session: RawSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The one answer to a request (its `result` or its `error`); notifications skipped."""
    request_id = next(_ids)
    async with session.request(request_id, method, params) as messages:
        [answer] = [message async for message in messages if message.get("id") == request_id]
    return answer


async def create(session: RawSession, arguments: dict[str, Any], **task: Any) -> dict[str, Any]:
    """A new `test.sleep` task: its Task."""
    params = {"name": "test.sleep", "arguments": arguments, "task": task}
    answer = await rpc(session, "tools/call", params)
    created: dict[str, Any] = answer["result"]["task"]
    return created


def retention_ms() -> int:
    return int(abp_settings().JOB_RETENTION_DAYS * 86_400_000)


@pytest.mark.parametrize(("mode", "served"), [("legacy", True), ("auto", False)])
def test_these_tasks_are_advertised_on_the_2025_wire_only(
    stack: Stack, mode: str, served: bool
) -> None:
    found: dict[str, Any] = {}
    key = fresh_key()

    async def scenario() -> None:
        async with official_client(url_of(stack), key=key, mode=mode) as client:
            found["capability"] = client.server_capabilities.tasks
            found["extensions"] = client.server_capabilities.extensions
            found["tools"] = (await client.list_tools()).tools
            with pytest.raises(MCPError) as raised:
                await client.session.send_request(
                    types.GetTaskRequest(params=types.GetTaskRequestParams(task_id="x")),
                    types.GetTaskResult,
                )
            found["code"] = raised.value.code
            if served:
                found["listed"] = await client.session.send_request(
                    types.ListTasksRequest(), types.ListTasksResult
                )

    anyio.run(scenario)
    executions = {tool.execution and tool.execution.task_support for tool in found["tools"]}
    if served:
        capability = found["capability"]
        assert capability.list is not None
        assert capability.cancel is not None
        assert capability.requests.tools.call is not None
        assert executions == {"optional"}
        assert found["code"] == INVALID_PARAMS  # unknown task
        assert found["listed"].tasks == []
        assert found["extensions"] is None
    else:
        assert found["capability"] is None
        assert executions == {None}
        # The tasks extension's instead (tests/stack/test_mcp_tasks_extension.py), which this
        # client does not declare.
        assert found["extensions"] == {TASKS_EXTENSION: {}}
        assert found["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY


def test_a_cancelled_task_is_cancelled_before_the_answer_and_stays_cancelled(
    stack: Stack,
) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        task = await create(session, LONG, ttl=60_000)
        task_id = task["taskId"]
        found["created"] = task
        # Running after the request that created it has ended.
        await eventually_async(Job.objects.filter(pk=task_id, status=JobStatus.RUNNING).first)
        found["working"] = await rpc(session, "tasks/get", {"taskId": task_id})
        found["cancel"] = await rpc(session, "tasks/cancel", {"taskId": task_id})
        found["row"] = await in_thread(lambda: Job.objects.get(pk=task_id))
        found["stopped"] = await eventually_async(
            Job.objects.filter(pk=task_id, stopped_at__isnull=False).first
        )
        found["after"] = await rpc(session, "tasks/get", {"taskId": task_id})
        found["again"] = await rpc(session, "tasks/cancel", {"taskId": task_id})
        found["result"] = await rpc(session, "tasks/result", {"taskId": task_id})

    raw(stack, scenario)
    created = found["created"]
    assert (created["status"], created["ttl"], created["pollInterval"]) == ("working", 60_000, 1000)
    datetime.fromisoformat(created["createdAt"])
    assert found["working"]["result"]["status"] == "working"
    assert found["cancel"]["result"]["status"] == "cancelled"
    assert found["cancel"]["result"]["taskId"] == created["taskId"]
    # The row was settled before the answer was sent.
    at_answer = found["row"]
    assert (at_answer.status, at_answer.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    stopped = found["stopped"]
    assert (stopped.status, stopped.settled_at) == (JobStatus.CANCELLED, at_answer.settled_at)
    assert stopped.stopped_at is not None
    assert at_answer.settled_at is not None
    assert (stopped.stopped_at - at_answer.settled_at).total_seconds() < 2.0  # by the cancel
    assert found["after"]["result"]["status"] == "cancelled"
    assert found["again"]["error"]["code"] == INVALID_PARAMS
    result = found["result"]["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "CANCELLED"
    assert result["_meta"] == {RELATED_TASK: {"taskId": created["taskId"]}}


def test_a_tasks_result_is_the_plain_calls_result_and_a_finished_task_cannot_be_cancelled(
    stack: Stack,
) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        task = await create(session, SHORT)
        task_id = task["taskId"]
        found["created"] = task
        # Asked at once: the answer waits for the job.
        found["result"] = await rpc(session, "tasks/result", {"taskId": task_id})
        found["again"] = await rpc(session, "tasks/result", {"taskId": task_id})
        plain = {"name": "test.sleep", "arguments": SHORT}
        found["plain"] = await rpc(session, "tools/call", plain)
        found["cancel"] = await rpc(session, "tasks/cancel", {"taskId": task_id})
        found["after"] = await rpc(session, "tasks/get", {"taskId": task_id})

    raw(stack, scenario)
    task_id = found["created"]["taskId"]
    assert found["created"]["ttl"] == retention_ms()  # none asked: as long as rows are kept
    result = found["result"]["result"]
    assert found["again"]["result"] == result  # as often as asked
    assert result["_meta"] == {RELATED_TASK: {"taskId": task_id}}
    assert {**result, "_meta": None} == {**found["plain"]["result"], "_meta": None}
    assert result["structuredContent"] == {"echo": "done", "steps": 3}
    assert found["cancel"]["error"]["code"] == INVALID_PARAMS
    after = found["after"]["result"]
    assert after["status"] == "completed"
    assert "pollInterval" not in after
    job = Job.objects.get(pk=task_id)
    assert (job.status, job.cancel_source) == (JobStatus.SUCCEEDED, "")


def test_a_task_is_its_keys_in_any_of_its_sessions_and_no_other_keys(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(
        mine: RawSession, same_key: RawSession, other: RawSession, _: RawSession
    ) -> None:
        task_id = (await create(mine, LONG))["taskId"]
        await rpc(mine, "tools/call", {"name": "test.sleep", "arguments": SHORT})
        plain = await in_thread(
            lambda: Job.objects.exclude(pk=task_id).get(session_id=uuid.UUID(hex=mine.session_id))
        )
        # Its first progress report written: the two listings read the same row.
        await eventually_async(Job.objects.filter(pk=task_id, stage="sleeping").first)
        found["mine"] = await rpc(mine, "tasks/list", {})
        found["same key"] = await rpc(same_key, "tasks/list", {})
        found["other"] = await rpc(other, "tasks/list", {})
        found["foreign"] = [
            await rpc(other, method, {"taskId": task_id})
            for method in ("tasks/get", "tasks/result", "tasks/cancel")
        ]
        found["not tasks"] = [
            await rpc(mine, "tasks/get", {"taskId": str(plain.id)}),
            await rpc(mine, "tasks/get", {"taskId": "not-a-uuid"}),
            await rpc(mine, "tasks/list", {"cursor": str(plain.id)}),
        ]
        found["still"] = await rpc(mine, "tasks/get", {"taskId": task_id})
        found["task"] = task_id

    raw(stack, scenario, sessions=2, keys=2)
    assert [task["taskId"] for task in found["mine"]["result"]["tasks"]] == [found["task"]]
    assert found["same key"]["result"] == found["mine"]["result"]
    assert "nextCursor" not in found["mine"]["result"]
    assert found["other"]["result"]["tasks"] == []
    for answer in found["foreign"] + found["not tasks"]:
        assert answer["error"]["code"] == INVALID_PARAMS
    assert found["still"]["result"]["status"] == "working"


def test_ending_the_session_cancels_its_tasks_as_a_disconnect(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        task_id = (await create(session, LONG))["taskId"]
        await eventually_async(Job.objects.filter(pk=task_id, status=JobStatus.RUNNING).first)
        await session.close()
        found["job"] = await eventually_async(
            Job.objects.filter(pk=task_id, stopped_at__isnull=False).first
        )

    raw(stack, scenario)
    job = found["job"]
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.DISCONNECT)


def test_a_task_the_call_service_refuses_is_an_error_with_the_abp_error(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        bad = {"name": "test.sleep", "arguments": {"steps": "many"}, "task": {}}
        found["bad"] = await rpc(session, "tools/call", bad)
        unknown = {"name": "no.such.tool", "arguments": {}, "task": {}}
        found["unknown"] = await rpc(session, "tools/call", unknown)
        found["listed"] = await rpc(session, "tasks/list", {})

    raw(stack, scenario)
    error = found["bad"]["error"]
    assert error["code"] == INVALID_PARAMS
    assert (error["data"]["code"], error["data"]["retryable"]) == ("INVALID_TYPE", False)
    assert found["unknown"]["error"]["code"] == INVALID_PARAMS
    assert found["listed"]["result"]["tasks"] == []
