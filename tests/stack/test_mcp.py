"""The MCP door at /mcp on the real stack, driven by the official Python client and raw HTTP.

The client runs in both eras: `mode="legacy"` (the 2025 initialize handshake) and
the default (`auto`: the 2026-07-28 session-less exchange when the server speaks
it). Raw HTTP checks the 2025 wire itself: one message per request id, refusals.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
import redis
from django.urls import reverse
from mcp.shared.exceptions import MCPError

from capabilities.access import agent_keys
from capabilities.endings import cancellation, key_revocation
from capabilities.lane import lane as local_lane
from capabilities.models import AgentKey, AgentSession, CancelSource, Door, Job, JobStatus
from capabilities.work import registry
from tests.support.admin_clients import client_for
from tests.support.mcp_clients import RawSession, official_client, suite_key
from tests.support.stack import Stack
from tests.support.waiting import eventually, eventually_async, in_thread

pytestmark = pytest.mark.usefixtures("database")

MODES = ["legacy", "auto"]
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}  # a minute, unless cancelled
SHORT = {"mode": "checkpoint", "steps": 3, "stepMs": 10}
PAGES = "".join(
    f"<section style='page-break-after: always'><h1>Page {n}</h1>{'<p>text</p>' * 30}</section>"
    for n in range(300)
)


def url_of(stack: Stack) -> str:
    return f"{stack.http_url}/mcp"


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    anyio.run(scenario)


def manifest(stack: Stack) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{stack.http_url}/abp.json", timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return {entry["name"]: entry for entry in document["capabilities"]}


def newest_job(capability: str, since: float) -> Job | None:
    """The newest job of an MCP session for the capability, made after `since`."""
    return (
        Job.objects.filter(capability=capability, session__door=Door.MCP)
        .filter(created_at__gte=_aware(since))
        .order_by("-created_at")
        .first()
    )


def _aware(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


def settled(capability: str, since: float) -> Job | None:
    """The newest MCP job of the capability since `since`, once it has settled."""
    job = newest_job(capability, since)
    return job if job is not None and not job.is_active else None


def stopped(job_id: uuid.UUID) -> Job | None:
    return Job.objects.filter(pk=job_id, stopped_at__isnull=False).first()


# -- tools ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_tools_are_the_capabilities_with_the_manifests_schemas(stack: Stack, mode: str) -> None:
    listed: dict[str, Any] = {}

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            result = await client.list_tools()
            listed.update({tool.name: tool for tool in result.tools})

    run(scenario)
    expected = manifest(stack)
    # The suite's key is a service key: a capability that needs a user's permission
    # is not listed for it (tests/stack/test_users_stack.py lists them for users).
    guarded = {spec.name for spec in registry.all_specs() if spec.permissions}
    assert guarded
    assert set(listed) == set(expected) - guarded
    for name, tool in listed.items():
        assert tool.input_schema == expected[name]["inputSchema"]
        assert tool.output_schema == expected[name]["outputSchema"]
        assert tool.meta["abp/available"] is True


@pytest.mark.parametrize("mode", MODES)
def test_a_markdown_call_returns_its_data_as_structured_content(stack: Stack, mode: str) -> None:
    found: dict[str, Any] = {}
    since = time.time()

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            result = await client.call_tool("convert.markdownToHtml", {"markdown": "# Hi"})
            found["result"] = result

    run(scenario)
    result = found["result"]
    assert result.is_error is False
    assert result.structured_content == {"html": "<h1>Hi</h1>"}
    assert json.loads(result.content[0].text) == {"html": "<h1>Hi</h1>"}
    job = settled("convert.markdownToHtml", since)
    assert job is not None
    assert job.queue == local_lane.LOCAL_QUEUE
    # Answered by the Daphne whose lane ran it, as the WebSocket doors are: one
    # statement settled it and claimed its delivery (no note, no second claim).
    assert job.delivered_at == job.settled_at


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_are_an_error_result_with_the_abp_error(stack: Stack, mode: str) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            found["result"] = await client.call_tool("convert.markdownToHtml", {"markdown": 5})

    run(scenario)
    result = found["result"]
    assert result.is_error is True
    error = result.structured_content["error"]
    assert (error["code"], error["details"]["path"], error["retryable"]) == (
        "INVALID_TYPE",
        "params.markdown",
        False,
    )
    assert result.content[0].text.startswith("INVALID_TYPE: ")


@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_tool_is_invalid_params(stack: Stack, mode: str) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            with pytest.raises(MCPError) as raised:
                await client.call_tool("no.such.tool", {})
            found["code"] = raised.value.code

    run(scenario)
    assert found["code"] == -32602


# -- cancellation ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_long_export_cancelled_after_its_first_layout_progress_stops_at_once(
    stack: Stack, mode: str
) -> None:
    reports: list[tuple[float, str | None]] = []
    outcome: dict[str, Any] = {}
    since = time.time()

    async def scenario() -> None:
        layout = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reports.append((progress, message))
            if message == "layout":
                layout.set()

        async with official_client(url_of(stack), mode=mode) as client:
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    outcome["result"] = await client.call_tool(
                        "export.pdf", {"html": PAGES}, progress_callback=on_progress
                    )

                group.start_soon(call)
                with anyio.fail_after(60):
                    await layout.wait()
                outcome["cancelled_at"] = time.time()
                group.cancel_scope.cancel()
            # The session stays open until the cancel has landed: closing it at once
            # would race the cancel with the session's end (a disconnect).
            await eventually_async(lambda: settled("export.pdf", since))

    run(scenario)
    assert "result" not in outcome  # no result reached the client
    job = eventually(lambda: newest_job("export.pdf", since))
    done = eventually(lambda: stopped(job.id), timeout=5)
    assert done.status == JobStatus.CANCELLED
    assert done.cancel_source == CancelSource.AGENT
    assert done.stopped_at is not None
    assert done.stopped_at.timestamp() - outcome["cancelled_at"] < 2.0
    values = [value for value, _ in reports]
    assert values == sorted(set(values))  # strictly increasing


@pytest.mark.parametrize("mode", MODES)
def test_a_client_timeout_cancels_the_job(stack: Stack, mode: str) -> None:
    since = time.time()

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            with pytest.raises(MCPError):
                await client.call_tool("test.sleep", LONG, read_timeout_seconds=1)
            await eventually_async(lambda: settled("test.sleep", since))

    run(scenario)
    job = eventually(lambda: newest_job("test.sleep", since))
    done = eventually(lambda: stopped(job.id), timeout=5)
    assert (done.status, done.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)


def test_an_operators_cancel_reaches_the_mcp_client_as_an_error_result(stack: Stack) -> None:
    found: dict[str, Any] = {}
    since = time.time()

    async def scenario() -> None:
        async with (
            official_client(url_of(stack), mode="legacy") as client,
            anyio.create_task_group() as group,
        ):

            async def call() -> None:
                found["result"] = await client.call_tool("test.sleep", LONG)

            group.start_soon(call)
            job = await eventually_async(lambda: newest_job("test.sleep", since))
            await in_thread(lambda: cancellation.cancel(job.id, source=CancelSource.OPERATOR))

    run(scenario)
    result = found["result"]
    assert result.is_error is True
    assert result.structured_content["error"]["code"] == "CANCELLED"


# -- the 2025 wire, raw ---------------------------------------------------------------------


def raw(stack: Stack, scenario: Callable[[RawSession], Awaitable[None]], key: str = "") -> None:
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            session = RawSession(http, url_of(stack), key or suite_key())
            await session.open()
            await scenario(session)

    run(main)


def test_a_cancelled_call_gets_exactly_one_message_for_its_id_minus_32800(stack: Stack) -> None:
    seen: list[dict[str, Any]] = []

    async def scenario(session: RawSession) -> None:
        params = {"name": "test.sleep", "arguments": LONG, "_meta": {"progressToken": "p"}}
        async with session.request(7, "tools/call", params) as messages:
            async for message in messages:
                seen.append(message)
                if message.get("method") == "notifications/progress" and len(seen) == 1:
                    taken = await session.notify("notifications/cancelled", {"requestId": 7})
                    assert taken.status_code == 202
        await session.close()

    raw(stack, scenario)
    answers = [message for message in seen if message.get("id") == 7]
    assert len(answers) == 1
    assert answers[0]["error"]["code"] == -32800


def test_a_cancel_after_the_call_finished_leaves_it_succeeded(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        params = {"name": "test.sleep", "arguments": SHORT}
        async with session.request(3, "tools/call", params) as messages:
            found["answer"] = [m async for m in messages if m.get("id") == 3]
        taken = await session.notify("notifications/cancelled", {"requestId": 3})
        found["status"] = taken.status_code
        found["session"] = session.session_id

    raw(stack, scenario)
    [answer] = found["answer"]
    assert answer["result"]["isError"] is False
    job = Job.objects.get(session_id=uuid.UUID(hex=found["session"]))
    assert job.status == JobStatus.SUCCEEDED
    assert job.cancel_source == ""


def test_a_cancel_that_overtakes_its_call_still_cancels_it(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        # Its own POST, so it can reach the server first: here it surely does.
        taken = await session.notify("notifications/cancelled", {"requestId": 9})
        assert taken.status_code == 202
        params = {"name": "test.sleep", "arguments": LONG}
        async with session.request(9, "tools/call", params) as messages:
            found["answer"] = [m async for m in messages if m.get("id") == 9]
        # A later call with another id runs as usual.
        short = {"name": "test.sleep", "arguments": SHORT}
        async with session.request(10, "tools/call", short) as messages:
            found["next"] = [m async for m in messages if m.get("id") == 10]
        found["session"] = session.session_id

    raw(stack, scenario)
    [answer] = found["answer"]
    assert answer["error"]["code"] == -32800
    [following] = found["next"]
    assert following["result"]["isError"] is False
    # Nothing was stored for the cancelled call: the session's one job is the next one.
    [job] = Job.objects.filter(session_id=uuid.UUID(hex=found["session"]))
    assert job.status == JobStatus.SUCCEEDED


def test_ending_the_mcp_session_cancels_its_running_calls_as_a_disconnect(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario(session: RawSession) -> None:
        found["session"] = session.session_id
        params = {"name": "test.sleep", "arguments": LONG, "_meta": {"progressToken": "p"}}
        async with session.request(1, "tools/call", params) as messages:
            async for message in messages:
                if message.get("method") == "notifications/progress":
                    break
        # The call's stream is closed, the session still holds the call: end it.
        closed = await session.close()
        found["status"] = closed.status_code

    raw(stack, scenario)
    assert found["status"] == 200
    session_id = uuid.UUID(hex=found["session"])
    job = eventually(
        lambda: Job.objects.filter(session_id=session_id, stopped_at__isnull=False).first()
    )
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.DISCONNECT)
    row = eventually(
        lambda: AgentSession.objects.filter(pk=session_id, closed_at__isnull=False).first()
    )
    assert row.door == Door.MCP
    assert row.closed_at is not None


# -- refusals -------------------------------------------------------------------------------


def post(stack: Stack, body: bytes, **headers: str) -> httpx2.Response:
    base = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    return httpx2.post(url_of(stack), content=body, headers={**base, **headers}, timeout=30)


INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "refusals", "version": "1"},
        },
    }
).encode()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_no_key_a_wrong_key_and_a_revoked_key_are_refused_with_why(stack: Stack) -> None:
    key, plaintext = agent_keys.create_key("mcp revoked")
    key_revocation.revoke(AgentKey.objects.filter(pk=key.pk))
    for headers, reason in (
        ({}, "missing-credentials"),
        (bearer("abp_00000000_wrong"), "invalid-credentials"),
        (bearer(plaintext), "key-revoked"),
    ):
        response = post(stack, INITIALIZE, **headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer ")
        assert response.json()["error"]["data"]["reason"] == reason
        # ACP's "authentication required", as the JSON-RPC door answers a refused key.
        assert response.json()["error"]["code"] == -32000
    assert_healthy(stack)


def test_a_session_id_used_with_another_key_is_not_found(stack: Stack) -> None:
    opened = post(stack, INITIALIZE, **bearer(suite_key()))
    session_id = opened.headers["mcp-session-id"]
    other = agent_keys.create_key("mcp other")[1]
    listing = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    response = post(
        stack,
        listing,
        **bearer(other),
        **{"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"},
    )
    assert response.status_code == 404
    assert_healthy(stack)


def test_an_origin_that_is_not_allowed_is_forbidden(stack: Stack) -> None:
    response = post(stack, INITIALIZE, **bearer(suite_key()), Origin="https://evil.example")
    assert response.status_code == 403
    assert_healthy(stack)


def test_an_oversized_body_is_refused_before_it_is_read(stack: Stack) -> None:
    import os

    too_big = b"x" * (int(os.environ["ABP_MAX_FRAME_BYTES"]) + 1)
    response = post(stack, too_big, **bearer(suite_key()))
    assert response.status_code == 413
    assert_healthy(stack)


def test_malformed_json_rpc_is_a_parse_error(stack: Stack) -> None:
    response = post(stack, b"{not json", **bearer(suite_key()))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    assert_healthy(stack)


def assert_healthy(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with official_client(url_of(stack), mode="legacy") as client:
            found["result"] = await client.call_tool("convert.markdownToHtml", {"markdown": "ok"})

    run(scenario)
    assert found["result"].is_error is False


def test_mcp_jobs_show_in_the_admin_marked_with_their_door(stack: Stack) -> None:
    since = time.time()
    assert_healthy(stack)
    job = newest_job("convert.markdownToHtml", since)
    assert job is not None
    staff = client_for(staff=True)
    listing = staff.get(reverse("admin:capabilities_job_changelist"), {"session__door": "mcp"})
    assert listing.status_code == 200
    assert job.call_id in listing.content.decode()
    page = staff.get(reverse("admin:capabilities_job_change", args=[job.pk]))
    assert ">MCP<" in page.content.decode()


def test_binary_results_are_inline_up_to_512_kib_then_a_signed_download_url(
    stack: Stack,
) -> None:
    found: dict[int, Any] = {}

    async def scenario() -> None:
        async with official_client(url_of(stack), mode="legacy") as client:
            for size in (100_000, 600_000):
                params = {"steps": 0, "fileBytes": size}
                found[size] = await client.call_tool("test.sleep", params)

    run(scenario)
    small = found[100_000].structured_content["file"]
    assert (small["encoding"], small["size"]) == ("base64", 100_000)
    large = found[600_000].structured_content["file"]
    assert "content" not in large
    assert large["size"] == 600_000
    with urllib.request.urlopen(large["downloadUrl"], timeout=10) as response:
        assert len(response.read()) == 600_000


@pytest.mark.parametrize("mode", MODES)
def test_a_call_answered_through_celery_leaves_no_channel_subscribed(
    stack: Stack, mode: str
) -> None:
    # Each call watches its job on a channel of its own; channels_redis forgets one only
    # when a receive on it is cancelled, so a call answered by a worker's note kept its
    # queue and its Redis subscription for good: one per call, in every Daphne.
    def watches() -> int:
        with redis.Redis(host="127.0.0.1", port=stack.redis_port) as client:
            return sum(b"call." in name for name in client.pubsub_channels())

    before = watches()

    async def scenario() -> None:
        async with official_client(url_of(stack), mode=mode) as client:
            for _ in range(5):  # test.sleep runs on the heavy worker, never in the lane
                result = await client.call_tool("test.sleep", SHORT)
                assert result.is_error is False

    run(scenario)
    eventually(lambda: watches() <= before, timeout=5)
