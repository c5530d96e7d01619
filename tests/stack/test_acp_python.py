"""The JSON-RPC door (`/abp/rpc`) driven by the ACP Python SDK's WebSocket transport.

`agent-client-protocol`'s `Connection` numbers its requests from 0, answers our
notifications through a handler, and never sends `$/cancel_request` by itself: the
tests send it by hand, as an ACP client does when its user cancels.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from acp.connection import Connection, StreamDirection, StreamEvent
from acp.exceptions import RequestError
from acp.schema import ClientCapabilities, Implementation, InitializeRequest, InitializeResponse
from acp.ws.client import create_websocket_stream
from websockets.exceptions import ConnectionClosed

from capabilities.models import CancelSource, Job, JobStatus
from tests.support.jsonrpc_relay import auth_headers
from tests.support.rpc_agent import rpc_url
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}  # a minute, unless cancelled
CLIENT_INFO: dict[str, Any] = {"name": "acp-python-tests", "version": "0.12.1"}


class Client:
    """What the SDK's connection heard from us, and the requests it sent."""

    def __init__(self) -> None:
        self.progress: list[dict[str, Any]] = []
        self.first_progress = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []

    async def handle(self, method: str, params: Any, is_notification: bool) -> Any:
        """The SDK's method handler: our notifications land here."""
        if method == "_abp/progress":
            self.progress.append(params)
            self.first_progress.set()
            return None
        if is_notification:
            return None
        raise RequestError.method_not_found(method)

    def observe(self, event: StreamEvent) -> None:
        if event.direction == StreamDirection.OUTGOING:
            self.sent.append(event.message)
        else:
            self.received.append(event.message)

    async def request_id_of(self, method: str) -> Any:
        """The id the SDK gave its (only) request for `method`."""
        async with asyncio.timeout(10):
            while True:
                ids = [m["id"] for m in self.sent if m.get("method") == method and "id" in m]
                if ids:
                    (request_id,) = ids
                    return request_id
                await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def sdk_connection(stack: Stack) -> AsyncIterator[tuple[Connection, Client]]:
    """An SDK connection to `/abp/rpc` with the suite's key, not yet initialized."""
    transport = await create_websocket_stream(rpc_url(stack.ws_url), headers=auth_headers())
    client = Client()
    connection = Connection(client.handle, transport)
    connection.add_observer(client.observe)
    try:
        yield connection, client
    finally:
        await connection.close()


async def initialize(connection: Connection) -> str:
    """Initialize as the brief's minimal ACP client; the session's id."""
    result = await connection.send_request(
        "initialize", {"protocolVersion": 1, "clientInfo": CLIENT_INFO}
    )
    session_id: str = result["_meta"]["abp/sessionId"]
    return session_id


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        async with asyncio.timeout(60):
            await scenario()

    asyncio.run(main())


def job_of(session_id: str, call_id: str) -> Job | None:
    return Job.objects.filter(session_id=uuid.UUID(session_id), call_id=call_id).first()


def stopped_job(session_id: str, call_id: str) -> Job | None:
    job = job_of(session_id, call_id)
    return job if job is not None and job.stopped_at is not None else None


def long_call(call_id: str, token: Any) -> dict[str, Any]:
    return {
        "capability": "test.sleep",
        "params": LONG,
        "callId": call_id,
        "_meta": {"progressToken": token},
    }


# -- initialize and a plain call -----------------------------------------------------------


def test_initialize_with_the_sdks_own_request_model_is_a_valid_acp_response(
    stack: Stack,
) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            # What an ACP client built on the SDK sends: clientCapabilities included.
            request = InitializeRequest(
                protocol_version=1,
                client_capabilities=ClientCapabilities(),
                client_info=Implementation(name="acp-python-tests", version="0.12.1"),
            ).model_dump(mode="json", by_alias=True, exclude_none=True)
            found["raw"] = await connection.send_request("initialize", request)
            found["sent"] = list(client.sent)

    run(scenario)
    raw = found["raw"]
    response = InitializeResponse.model_validate(raw)
    assert response.protocol_version == 1
    assert response.auth_methods == []
    assert response.agent_info is not None
    assert raw["agentCapabilities"]["loadSession"] is False
    jobs = raw["agentCapabilities"]["_meta"]["abp.jobs"]
    names = {entry["name"]: entry["available"] for entry in jobs["capabilities"]}
    assert {"export.pdf", "convert.markdownToHtml", "test.sleep"} <= set(names)
    assert names["convert.markdownToHtml"] is True
    assert raw["_meta"]["abp/sessionId"]
    assert raw["_meta"]["abp/resumeToken"]
    assert found["sent"][0]["id"] == 0  # the SDK's ids start at 0


def test_a_markdown_call_through_the_sdk(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, _client):
            found["session"] = await initialize(connection)
            listed = await connection.send_request("_abp/capabilities/list", {})
            found["listed"] = {entry["name"]: entry for entry in listed["capabilities"]}
            found["result"] = await connection.send_request(
                "_abp/call",
                {"capability": "convert.markdownToHtml", "params": {"markdown": "# Hi"}},
            )

    run(scenario)
    listed = found["listed"]
    assert listed["convert.markdownToHtml"]["inputSchema"]["type"] == "object"
    assert set(listed["convert.markdownToHtml"]) >= {
        "name",
        "description",
        "inputSchema",
        "outputSchema",
        "timeout",
        "available",
    }
    result = found["result"]
    assert result["data"] == {"html": "<h1>Hi</h1>"}
    assert isinstance(result["metadata"]["duration"], int | float)
    job = job_of(found["session"], result["callId"])
    assert job is not None
    assert job.status == JobStatus.SUCCEEDED


def test_a_method_without_params_as_the_sdk_sends_it(stack: Stack) -> None:
    # The SDK sends `"params": null` when a request has none; the method takes none.
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            await initialize(connection)
            found["listed"] = await connection.send_request("_abp/capabilities/list")
            found["sent"] = client.sent[-1]

    run(scenario)
    assert found["sent"]["params"] is None
    assert "convert.markdownToHtml" in {c["name"] for c in found["listed"]["capabilities"]}


def test_an_sdk_request_error_carries_the_abp_error(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, _client):
            await initialize(connection)
            with pytest.raises(RequestError) as raised:
                await connection.send_request(
                    "_abp/call", {"capability": "convert.markdownToHtml", "params": {"markdown": 5}}
                )
            found["error"] = raised.value

    run(scenario)
    error = found["error"]
    assert error.code == -32602
    assert error.data["code"] == "INVALID_TYPE"
    assert error.data["details"]["path"] == "params.params.markdown"
    assert error.data["retryable"] is False


# -- cancellation ------------------------------------------------------------------------------


def test_a_cancel_request_after_the_first_progress_cancels_and_stops_the_job(
    stack: Stack,
) -> None:
    call_id = f"acp-{uuid.uuid4().hex[:8]}"
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            found["session"] = await initialize(connection)
            call = asyncio.create_task(
                connection.send_request("_abp/call", long_call(call_id, "acp-progress"))
            )
            await asyncio.wait_for(client.first_progress.wait(), 20)
            request_id = await client.request_id_of("_abp/call")
            found["request_id"] = request_id
            found["cancelled_at"] = time.time()
            await connection.send_notification("$/cancel_request", {"requestId": request_id})
            with pytest.raises(RequestError) as raised:
                await asyncio.wait_for(call, 15)
            found["error"] = raised.value
            # Anything sent for the call after its error would arrive now.
            await asyncio.sleep(0.5)
            found["received"] = list(client.received)
            found["progress"] = list(client.progress)

    run(scenario)
    assert found["request_id"] == 1  # initialize was 0
    error = found["error"]
    assert error.code == -32800
    assert error.data["code"] == "CANCELLED"
    assert error.data.get("callId", call_id) == call_id
    answers = [m for m in found["received"] if m.get("id") == 1 and "method" not in m]
    assert len(answers) == 1, answers
    first = found["progress"][0]
    assert first["progressToken"] == "acp-progress"
    assert first["callId"] == call_id
    assert {"progress", "total", "percentage", "stage", "status"} <= set(first)
    running = [p["progress"] for p in found["progress"] if p["status"] == "running"]
    assert running == sorted(set(running))  # strictly increasing
    job = eventually(lambda: stopped_job(found["session"], call_id), timeout=10)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.stopped_at is not None
    assert job.stopped_at.timestamp() - found["cancelled_at"] < 2.0
    eventually(lambda: f"Job {job.id} stopped on cancel" in stack.worker.log_text())


def test_abp_cancel_is_confirmed_then_the_call_is_answered_cancelled(stack: Stack) -> None:
    call_id = f"acp-{uuid.uuid4().hex[:8]}"
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            found["session"] = await initialize(connection)
            call = asyncio.create_task(connection.send_request("_abp/call", long_call(call_id, 42)))
            await asyncio.wait_for(client.first_progress.wait(), 20)
            found["cancelled_at"] = time.time()
            found["confirmed"] = await connection.send_request(
                "_abp/cancel", {"callId": call_id, "reason": "user pressed stop"}
            )
            with pytest.raises(RequestError) as raised:
                await asyncio.wait_for(call, 15)
            found["error"] = raised.value
            found["order"] = [m.get("id") for m in client.received if "method" not in m]

    run(scenario)
    confirmed = found["confirmed"]
    assert confirmed["callId"] == call_id
    assert confirmed["cancelled"] is True
    error = found["error"]
    assert (error.code, error.data["code"]) == (-32800, "CANCELLED")
    # initialize (0), then the cancel's confirmation (2), then the call's -32800 (1).
    assert found["order"] == [0, 2, 1]
    job = eventually(lambda: stopped_job(found["session"], call_id), timeout=10)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "user pressed stop"
    assert job.stopped_at is not None
    assert job.stopped_at.timestamp() - found["cancelled_at"] < 2.0


def test_a_cancel_request_for_a_finished_call_changes_nothing(stack: Stack) -> None:
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            found["session"] = await initialize(connection)
            found["result"] = await connection.send_request(
                "_abp/call",
                {"capability": "test.sleep", "params": {"steps": 1, "stepMs": 1, "echo": "done"}},
            )
            # Twice, and once for an id never used: all ignored, nothing answered.
            for request_id in (1, 1, 99):
                await connection.send_notification("$/cancel_request", {"requestId": request_id})
            found["after"] = await connection.send_request("_abp/capabilities/list", {})
            found["received"] = list(client.received)

    run(scenario)
    assert found["result"]["data"]["echo"] == "done"
    assert [m.get("id") for m in found["received"] if "method" not in m] == [0, 1, 2]
    job = job_of(found["session"], found["result"]["callId"])
    assert job is not None
    assert job.status == JobStatus.SUCCEEDED


def test_a_shutdown_answers_the_call_in_flight_then_itself_then_closes(stack: Stack) -> None:
    call_id = f"acp-{uuid.uuid4().hex[:8]}"
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with sdk_connection(stack) as (connection, client):
            found["session"] = await initialize(connection)
            call = asyncio.create_task(
                connection.send_request("_abp/call", long_call(call_id, "bye"))
            )
            await asyncio.wait_for(client.first_progress.wait(), 20)
            found["shutdown"] = await connection.send_request("_abp/shutdown", {"reason": "bye"})
            with pytest.raises(RequestError) as raised:
                await asyncio.wait_for(call, 5)
            found["error"] = raised.value
            found["order"] = [m.get("id") for m in client.received if "method" not in m]
            found["closed"] = await closed(connection)

    run(scenario)
    assert found["shutdown"] == {}
    assert (found["error"].code, found["error"].data["code"]) == (-32800, "CANCELLED")
    assert found["order"] == [0, 1, 2]  # initialize, the call's -32800, then the shutdown's {}
    assert found["closed"]
    job = eventually(lambda: stopped_job(found["session"], call_id), timeout=10)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.SHUTDOWN)


async def closed(connection: Connection) -> bool:
    """Whether the server closed the socket within five seconds (the SDK then refuses to send)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            # Unknown notifications are ignored: harmless while the socket is still open.
            await connection.send_notification("_abp/still-there")
        except ConnectionError:
            return True
        except ConnectionClosed:
            # Closed, but the SDK's reader has not seen it yet: it will.
            await asyncio.sleep(0.05)
            continue
        await asyncio.sleep(0.05)
    return False
