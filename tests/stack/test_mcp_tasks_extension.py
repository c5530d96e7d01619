"""The tasks extension (SEP-2663) on the 2026-07-28 wire, on the real stack, over raw HTTP.

A `tools/call` that declares `io.modelcontextprotocol/tasks` and asks for no progress
is a task: a job the client polls with `tasks/get`, cancels with `tasks/cancel`,
belonging to the agent key that made it. fastmcp-tasks' client drives the same
round in tests/stack/test_mcp_fastmcp.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio
import httpx2
import pytest
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY

from capabilities.access import agent_keys
from capabilities.conf import abp_settings
from capabilities.mcp_door import task_service
from capabilities.models import SETTLED_STATUSES, CancelSource, Job, JobStatus
from tests.support.mcp_clients import TASKS_EXTENSION, RawModern, suite_key
from tests.support.stack import Stack
from tests.support.waiting import eventually, eventually_async, in_thread, seconds_between

pytestmark = pytest.mark.usefixtures("database")

LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}  # ten seconds, unless cancelled
SHORT = {"mode": "checkpoint", "steps": 3, "stepMs": 10, "echo": "done"}
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601


def modern(
    stack: Stack, scenario: Callable[..., Awaitable[None]], *, keys: int = 1, tasks: bool = True
) -> None:
    """Run `scenario` with one 2026 client per agent key (the suite's first)."""

    async def main() -> None:
        found = [suite_key()] + [
            await in_thread(lambda: agent_keys.create_key("mcp tasks other")[1])
            for _ in range(keys - 1)
        ]
        async with httpx2.AsyncClient(timeout=30) as http:
            url = f"{stack.http_url}/mcp"
            await scenario(*[RawModern(http, url, key, tasks=tasks) for key in found])

    anyio.run(main)


async def create(client: RawModern, arguments: dict[str, Any]) -> dict[str, Any]:
    """A new `test.sleep` task: the CreateTaskResult."""
    answer = await client.rpc("tools/call", {"name": "test.sleep", "arguments": arguments})
    created: dict[str, Any] = answer["result"]
    assert created["resultType"] == "task", answer
    return created


async def settled(client: RawModern, task_id: str, within: float = 10.0) -> dict[str, Any]:
    """`tasks/get` once the task's job has settled."""
    ended = Job.objects.filter(pk=task_id, status__in=SETTLED_STATUSES)
    await in_thread(lambda: eventually(ended.first, timeout=within))
    answer: dict[str, Any] = (await client.rpc("tasks/get", {"taskId": task_id}))["result"]
    return answer


def retention_ms() -> int:
    return int(abp_settings().JOB_RETENTION_DAYS * 86_400_000)


def test_a_task_completes_with_the_plain_calls_result(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(client: RawModern) -> None:
        created = await create(client, SHORT)
        found["created"] = created
        found["done"] = await settled(client, created["taskId"])
        found["again"] = (await client.rpc("tasks/get", {"taskId": created["taskId"]}))["result"]
        client.tasks = False
        plain = {"name": "test.sleep", "arguments": SHORT}
        found["plain"] = (await client.rpc("tools/call", plain))["result"]

    modern(stack, scenario)
    created, done = found["created"], found["done"]
    assert (created["status"], created["ttlMs"], created["pollIntervalMs"]) == (
        "working",
        retention_ms(),
        1000,
    )
    datetime.fromisoformat(created["createdAt"])
    assert done["resultType"] == "complete"
    assert (done["taskId"], done["status"]) == (created["taskId"], "completed")
    assert "pollIntervalMs" not in done
    result = done["result"]
    assert result["structuredContent"] == {"echo": "done", "steps": 3}
    assert {**result, "_meta": None} == {**found["plain"], "_meta": None}
    assert found["again"] == done  # as often as asked
    job = Job.objects.select_related("session").get(pk=created["taskId"])
    assert (job.status, job.cancel_source) == (JobStatus.SUCCEEDED, "")
    assert job.session.closed_at is not None
    assert job.session.close_reason == task_service.ROW_CLOSED_REASON


def test_a_task_outlives_its_request_and_the_grace_period(stack: Stack) -> None:
    # Longer than the reaper's grace period for sessions nobody holds.
    grace_ms = abp_settings().RESUME_GRACE_SECONDS * 1000
    outliving = {"mode": "checkpoint", "steps": int(grace_ms * 1.5 / 50), "stepMs": 50}
    found: dict[str, Any] = {}

    async def scenario(client: RawModern) -> None:
        created = await create(client, outliving)
        found["done"] = await settled(client, created["taskId"], within=grace_ms / 1000 * 4)
        found["job"] = await in_thread(lambda: Job.objects.get(pk=created["taskId"]))

    modern(stack, scenario)
    assert found["done"]["status"] == "completed", found["done"]
    job = found["job"]
    assert (job.status, job.cancel_source) == (JobStatus.SUCCEEDED, "")
    assert seconds_between(job.started_at, job.settled_at) * 1000 > grace_ms


def test_a_cancelled_task_is_cancelled_before_the_ack_and_stays_cancelled(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(client: RawModern) -> None:
        task_id = (await create(client, LONG))["taskId"]
        found["task"] = task_id
        await eventually_async(Job.objects.filter(pk=task_id, status=JobStatus.RUNNING).first)
        found["working"] = (await client.rpc("tasks/get", {"taskId": task_id}))["result"]
        found["cancel"] = await client.rpc("tasks/cancel", {"taskId": task_id})
        found["row"] = await in_thread(lambda: Job.objects.get(pk=task_id))
        found["stopped"] = await eventually_async(
            Job.objects.filter(pk=task_id, stopped_at__isnull=False).first
        )
        found["after"] = (await client.rpc("tasks/get", {"taskId": task_id}))["result"]
        found["again"] = await client.rpc("tasks/cancel", {"taskId": task_id})
        found["update"] = await client.rpc(
            "tasks/update", {"taskId": task_id, "inputResponses": {"x": {"action": "accept"}}}
        )
        found["last"] = (await client.rpc("tasks/get", {"taskId": task_id}))["result"]

    modern(stack, scenario)
    assert found["working"]["status"] == "working"
    assert found["cancel"]["result"]["resultType"] == "complete"
    assert set(found["cancel"]["result"]) <= {"resultType", "_meta"}  # an empty ack
    at_answer = found["row"]
    assert (at_answer.status, at_answer.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    stopped = found["stopped"]
    assert (stopped.status, stopped.settled_at) == (JobStatus.CANCELLED, at_answer.settled_at)
    for after in (found["after"], found["last"]):
        assert after["status"] == "cancelled"
        assert after["statusMessage"].startswith("CANCELLED: ")
        assert "result" not in after
    assert found["again"]["result"]["resultType"] == "complete"
    assert found["update"]["result"]["resultType"] == "complete"


def test_another_keys_task_is_an_unknown_task(stack: Stack) -> None:
    found: dict[str, Any] = {}
    unknown = "7c0f3a52-3b5e-4d1c-9a43-0d6f7c1e2b90"

    async def scenario(mine: RawModern, other: RawModern) -> None:
        task_id = (await create(mine, LONG))["taskId"]
        found["task"] = task_id
        found["foreign"] = [
            (await other.rpc(method, {"taskId": task_id, **extra}))["error"]
            for method, extra in _TASK_METHODS
        ]
        found["unknown"] = [
            (await mine.rpc(method, {"taskId": unknown, **extra}))["error"]
            for method, extra in _TASK_METHODS
        ]
        found["still"] = (await mine.rpc("tasks/get", {"taskId": task_id}))["result"]
        await mine.rpc("tasks/cancel", {"taskId": task_id})

    modern(stack, scenario, keys=2)
    task_id = found["task"]
    foreign = [
        {**error, "message": error["message"].replace(task_id, "ID")} for error in found["foreign"]
    ]
    unknown_ = [
        {**error, "message": error["message"].replace(unknown, "ID")} for error in found["unknown"]
    ]
    assert foreign == unknown_
    assert {error["code"] for error in foreign} == {INVALID_PARAMS}
    assert found["still"]["status"] == "working"  # the other key's cancel did nothing


_TASK_METHODS: list[tuple[str, dict[str, Any]]] = [
    ("tasks/get", {}),
    ("tasks/cancel", {}),
    ("tasks/update", {"inputResponses": {}}),
]


def test_a_failed_job_is_a_completed_task_with_an_error_result(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(client: RawModern) -> None:
        created = await create(client, {"mode": "fail", "steps": 1, "stepMs": 1})
        found["done"] = await settled(client, created["taskId"])

    modern(stack, scenario)
    done = found["done"]
    assert done["status"] == "completed"
    assert done["statusMessage"] == "INVALID_PARAMS: Asked to fail."
    assert done["result"]["isError"] is True
    assert done["result"]["structuredContent"]["error"]["code"] == "INVALID_PARAMS"


def test_which_calls_become_tasks_and_who_may_ask_about_them(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(client: RawModern) -> None:
        call = {"name": "test.sleep", "arguments": SHORT}
        asks_progress = {**call, "_meta": {"progressToken": "p"}}
        found["progress"] = (await client.rpc("tools/call", asks_progress))["result"]
        found["refused"] = await client.rpc("tools/call", {**call, "arguments": {"steps": "x"}})
        found["unknown tool"] = await client.rpc("tools/call", {"name": "no.such", "arguments": {}})
        task_id = (await create(client, SHORT))["taskId"]
        found["mismatch"] = await client.rpc("tasks/get", {"taskId": task_id}, **{"Mcp-Name": "x"})
        found["gone"] = [
            await client.rpc(method, {"taskId": task_id})
            for method in ("tasks/result", "tasks/list")
        ]
        client.tasks = False
        found["undeclared call"] = (await client.rpc("tools/call", {**call, "task": {}}))["result"]
        found["undeclared get"] = await client.rpc("tasks/get", {"taskId": task_id})

    modern(stack, scenario)
    assert found["progress"]["resultType"] == "complete"  # followed on its stream
    assert found["progress"]["structuredContent"] == {"echo": "done", "steps": 3}
    refused = found["refused"]["result"]  # no job, so no task: the plain call's refusal
    assert (refused["resultType"], refused["isError"]) == ("complete", True)
    assert refused["structuredContent"]["error"]["code"] == "INVALID_TYPE"
    assert found["unknown tool"]["error"]["code"] == INVALID_PARAMS
    assert found["mismatch"]["error"]["code"] == HEADER_MISMATCH
    assert [answer["error"]["code"] for answer in found["gone"]] == [METHOD_NOT_FOUND] * 2
    assert found["undeclared call"]["resultType"] == "complete"  # `task` means nothing here
    error = found["undeclared get"]["error"]
    assert error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert TASKS_EXTENSION in error["data"]["requiredCapabilities"]["extensions"]
