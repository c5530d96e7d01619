"""The JSON-RPC door at /abp/rpc on the real stack, against docs/jsonrpc.md.

One test per row of the error table and per behaviour: ids echoed exactly, the
initialize handshake, calls and progress, every way a call is cancelled (`_abp/cancel`,
`$/cancel_request`, a timeout, an operator, a shutdown, a revoked key), and a
resumed session's `_abp/result`. Every call is answered exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from capabilities.access import agent_keys
from capabilities.endings import cancellation, key_revocation
from capabilities.models import AgentKey, AgentSession, CancelSource, Job, JobStatus
from capabilities.work import registry
from tests.support.rpc_agent import Message, RpcAgent, is_response, rpc_url, same_id
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

LONG = {"mode": "checkpoint", "steps": 1500, "stepMs": 20}  # 30 s: always cancelled
SHORT = {"mode": "checkpoint", "steps": 2, "stepMs": 5}

# The table's message for each JSON-RPC code.
MESSAGES = {
    -32700: "Parse error",
    -32600: "Invalid request",
    -32601: "Method not found",
    -32602: "Invalid params",
    -32603: "Internal error",
    -32800: "Request cancelled",
    -32000: "Authentication required",
    -32002: "Resource not found",
    -32001: "Call failed",
}


@pytest.fixture
def rpc(stack: Stack) -> Iterator[RpcAgent]:
    """An initialized agent on the JSON-RPC door (its own session)."""
    with RpcAgent(rpc_url(stack.ws_url)) as agent:
        agent.start()
        yield agent


def new_call_id() -> str:
    # Unique across the run: some checks look jobs up by callId alone.
    return f"rpc-{uuid.uuid4().hex[:12]}"


def assert_error(response: Message, code: int, data_code: str) -> dict[str, Any]:
    """The response is this JSON-RPC error with this ABP code; its `data`."""
    assert response.get("jsonrpc") == "2.0", response
    assert "result" not in response, response
    error = response["error"]
    assert error["code"] == code, response
    assert error["message"] == MESSAGES[code], response
    data: dict[str, Any] = error["data"]
    assert data["code"] == data_code, response
    assert isinstance(data["message"], str), response
    assert data["message"], response
    assert isinstance(data["retryable"], bool), response
    return data


def assert_healthy(agent: RpcAgent) -> None:
    """The connection still answers; nothing else arrived before the answer."""
    before = len(agent.inbox)
    request_id = agent.request("_abp/capabilities/list", {})
    response = agent.response(request_id)
    assert "result" in response, response
    assert agent.inbox[before:] == [response], agent.inbox[before:]


def next_response(agent: RpcAgent, timeout: float = 10.0) -> Message:
    """The next response of any id (for frames whose id cannot be echoed)."""
    return agent.wait_for(is_response, timeout)


def job_of(agent: RpcAgent, call_id: str) -> Job:
    return Job.objects.get(session_id=agent.session_id, call_id=call_id)


def wait_job(agent: RpcAgent, call_id: str, timeout: float = 10.0, **filters: Any) -> Job:
    """The call's job once it matches `filters`."""
    return eventually(
        Job.objects.filter(session_id=agent.session_id, call_id=call_id, **filters).first,
        timeout,
    )


def wait_running(agent: RpcAgent, call_id: str) -> Job:
    return wait_job(agent, call_id, status=JobStatus.RUNNING)


def wait_stopped_by_cancel(stack: Stack, agent: RpcAgent, call_id: str) -> Job:
    """The call's job once the cancel itself stopped its work (the worker logs that)."""
    job = wait_job(agent, call_id, stopped_at__isnull=False)
    eventually(lambda: f"Job {job.id} stopped on cancel" in stack.worker.log_text())
    return job


def assert_cancelled(response: Message, call_id: str, source: str = "agent") -> None:
    """The response is the call's -32800 CANCELLED, by `source`."""
    data = assert_error(response, -32800, "CANCELLED")
    assert data["callId"] == call_id, response
    assert data["details"] == {"source": source}, response


def refusal(agent: RpcAgent) -> tuple[dict[str, Any], int | None]:
    """The -32000 a refused connection is told (id null), and its close code."""
    response = agent.wait_for(lambda m: is_response(m) and m.get("id") is None)
    assert "id" in response, response
    data = assert_error(response, -32000, "PERMISSION_DENIED")
    return data, agent.read_until_closed(timeout=5)


# -- the error table ----------------------------------------------------------------------


def test_a_frame_that_is_not_json_is_a_parse_error_with_a_null_id(rpc: RpcAgent) -> None:
    rpc.send_raw('{"jsonrpc": "2.0", "id": 3, "method": ')
    response = next_response(rpc)
    assert "id" in response
    assert response["id"] is None
    assert_error(response, -32700, "PARSE_ERROR")
    assert_healthy(rpc)


def test_a_batch_is_refused_as_one_invalid_request(rpc: RpcAgent) -> None:
    rpc.send([{"jsonrpc": "2.0", "id": 4, "method": "_abp/capabilities/list"}])
    rpc.receive_text()
    raw = rpc.inbox[-1]
    # One error object, not a batch of answers, and the request inside is not run.
    assert isinstance(raw, dict), raw
    assert raw["id"] is None
    assert_error(raw, -32600, "INVALID_REQUEST")
    assert_healthy(rpc)
    assert rpc.responses_to(4) == []


@pytest.mark.parametrize(
    "envelope",
    [
        {"id": 5, "method": "_abp/capabilities/list"},
        {"jsonrpc": "1.0", "id": 5, "method": "_abp/capabilities/list"},
        {"jsonrpc": 2.0, "id": 5, "method": "_abp/capabilities/list"},
        {"jsonrpc": "2.0", "id": 5},
        {"jsonrpc": "2.0", "id": 5, "method": 12},
        "just a string",
    ],
    ids=["no-jsonrpc", "jsonrpc-1.0", "jsonrpc-number", "no-method", "method-number", "string"],
)
def test_a_message_that_is_not_json_rpc_2_is_an_invalid_request(
    rpc: RpcAgent, envelope: Any
) -> None:
    rpc.send(envelope)
    response = next_response(rpc)
    # The id may be echoed when it could be read, or null (JSON-RPC 2.0, section 5).
    assert response.get("id") in (5, None), response
    assert_error(response, -32600, "INVALID_REQUEST")
    assert_healthy(rpc)


@pytest.mark.parametrize(
    "bad_id",
    [None, True, False, {"n": 1}, [1], "x" * 201],
    ids=["null", "true", "false", "object", "array", "string-201"],
)
def test_a_bad_id_is_an_invalid_request_answered_with_a_null_id(rpc: RpcAgent, bad_id: Any) -> None:
    call_id = new_call_id()
    rpc.send(
        {
            "jsonrpc": "2.0",
            "id": bad_id,
            "method": "_abp/call",
            "params": {"capability": "test.sleep", "params": SHORT, "callId": call_id},
        }
    )
    response = next_response(rpc)
    assert "id" in response
    assert response["id"] is None, response
    assert_error(response, -32600, "INVALID_REQUEST")
    assert not Job.objects.filter(call_id=call_id).exists()
    assert_healthy(rpc)


@pytest.mark.parametrize("method", ["_abp/capabilities/list", "_abp/call"])
def test_an_id_no_utf_8_can_carry_is_answered_and_harmless(rpc: RpcAgent, method: str) -> None:
    # A lone surrogate is a valid JSON escape, but no UTF-8 frame can hold it raw:
    # refused with a null id, or echoed escaped; never a lost answer or a dead socket.
    params = {"capability": "test.sleep", "params": SHORT} if method == "_abp/call" else {}
    # json.dumps escapes it (ensure_ascii), as any client would have to.
    rpc.send({"jsonrpc": "2.0", "id": "\ud800", "method": method, "params": params})
    response = next_response(rpc)
    if response["id"] is None:
        assert_error(response, -32600, "INVALID_REQUEST")
    else:
        assert response["id"] == "\ud800"
        assert "result" in response
    assert_healthy(rpc)


def test_the_id_of_a_request_in_flight_is_refused_and_its_call_answered_once(
    stack: Stack, rpc: RpcAgent
) -> None:
    first, second = new_call_id(), new_call_id()
    rpc.call("test.sleep", LONG, call_id=first, request_id=7)
    wait_running(rpc, first)

    rpc.call("test.sleep", SHORT, call_id=second, request_id=7)
    refused = rpc.response(7)
    assert_error(refused, -32600, "INVALID_REQUEST")
    assert not Job.objects.filter(call_id=second).exists()
    # Refused before it is run, whatever the method: this cancel cancels nothing.
    rpc.request("_abp/cancel", {"callId": first}, 7)
    assert_error(rpc.response(7), -32600, "INVALID_REQUEST")
    assert job_of(rpc, first).status == JobStatus.RUNNING

    # The first request is still this connection's 7: cancelling it by id works.
    rpc.cancel_request(7)
    assert_cancelled(rpc.response(7), first)
    rpc.drain(0.5)
    assert len(rpc.responses_to(7)) == 3
    assert wait_stopped_by_cancel(stack, rpc, first).status == JobStatus.CANCELLED
    # Answered, 7 is free again.
    assert "capabilities" in rpc.result(rpc.request("_abp/capabilities/list", {}, 7))


def test_every_method_but_initialize_needs_a_session_first(stack: Stack) -> None:
    call_id = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url)) as agent:
        agent.request("_abp/capabilities/list", {}, 1)
        assert_error(agent.response(1), -32600, "NOT_INITIALIZED")
        agent.call("test.sleep", SHORT, call_id=call_id, request_id=2)
        assert_error(agent.response(2), -32600, "NOT_INITIALIZED")
        agent.request("_abp/cancel", {"callId": call_id}, 3)
        assert_error(agent.response(3), -32600, "NOT_INITIALIZED")
        agent.request("_abp/shutdown", {}, 4)
        assert_error(agent.response(4), -32600, "NOT_INITIALIZED")
        # A notification is never answered, not even to say this.
        agent.cancel_request(2)
        agent.notify("_abp/shutdown", {})
        result = agent.start()
        assert agent.inbox[-1]["result"] == result
        assert len(agent.inbox) == 5
    assert not Job.objects.filter(call_id=call_id).exists()


def test_a_second_initialize_is_refused(rpc: RpcAgent) -> None:
    session_id = rpc.session_id
    response = rpc.initialize(request_id="again")
    assert response["id"] == "again"
    assert_error(response, -32600, "ALREADY_INITIALIZED")
    assert rpc.session_id == session_id
    assert_healthy(rpc)


def test_an_unknown_method_is_method_not_found(rpc: RpcAgent) -> None:
    rpc.request("_abp/no/such/method", {}, "unknown-1")
    assert_error(rpc.response("unknown-1"), -32601, "UNKNOWN_MESSAGE_TYPE")
    # ACP's own methods are not served here either.
    rpc.request("session/new", {"cwd": "/", "mcpServers": []}, "unknown-2")
    assert_error(rpc.response("unknown-2"), -32601, "UNKNOWN_MESSAGE_TYPE")
    assert_healthy(rpc)


def test_unknown_and_malformed_notifications_are_ignored(rpc: RpcAgent) -> None:
    rpc.notify("_abp/no/such/notification", {"x": 1})
    rpc.notify("$/cancel_request", {"requestId": True})
    rpc.notify("$/cancel_request", {})
    rpc.notify("$/cancel_request")
    rpc.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": "nonsense"})
    # A request method sent as a notification: nobody could hear its answer, so no job.
    call_id = new_call_id()
    rpc.notify("_abp/call", {"capability": "test.sleep", "params": SHORT, "callId": call_id})
    # Nothing comes back for any of them: the next message is the answer to this.
    assert_healthy(rpc)
    assert len(rpc.inbox) == 2  # initialize's and capabilities/list's responses
    assert not Job.objects.filter(call_id=call_id).exists()


@pytest.mark.parametrize(
    ("method", "params", "data_code", "path"),
    [
        ("_abp/call", {"params": SHORT}, "MISSING_PARAM", "params.capability"),
        (
            "_abp/call",
            {"capability": "test.sleep", "params": SHORT, "timeout": "soon"},
            "INVALID_TYPE",
            "params.timeout",
        ),
        (
            "_abp/call",
            {"capability": "test.sleep", "params": SHORT, "timeout": 10**10},
            "INVALID_PARAMS",
            "params.timeout",
        ),
        (
            "_abp/call",
            {"capability": "test.sleep", "params": {"steps": "x"}},
            "INVALID_TYPE",
            "params.params.steps",
        ),
        (
            "_abp/call",
            {"capability": "test.sleep", "params": {"stepMs": -1}},
            "INVALID_PARAMS",
            "params.params.stepMs",
        ),
        ("_abp/call", {"capability": "no.such.thing", "params": {}}, "UNKNOWN_CAPABILITY", None),
        ("_abp/cancel", {"reason": "no callId"}, "MISSING_PARAM", "params.callId"),
    ],
    ids=[
        "no-capability",
        "timeout-type",
        "timeout-over-max",
        "schema-type",
        "schema-minimum",
        "unknown-capability",
        "cancel-no-callid",
    ],
)
def test_invalid_params_name_the_field(
    rpc: RpcAgent, method: str, params: dict[str, Any], data_code: str, path: str | None
) -> None:
    call_id = new_call_id()
    if method == "_abp/call":
        params = {**params, "callId": call_id}
    rpc.request(method, params, "bad")
    data = assert_error(rpc.response("bad"), -32602, data_code)
    if path is not None:
        assert data["details"]["path"] == path, data
    # Refused before anything was stored.
    assert not Job.objects.filter(session_id=rpc.session_id).exists()
    assert_healthy(rpc)


def test_a_capability_error_keeps_its_code(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", {"steps": 1, "stepMs": 1, "mode": "fail"}, call_id=call_id)
    response = rpc.response(request_id)
    data = assert_error(response, -32602, "INVALID_PARAMS")
    assert data["callId"] == call_id
    # The worker named `params.mode`; on this door the field is the request's params.params.
    assert data["details"]["path"] == "params.params.mode", data
    assert job_of(rpc, call_id).status == JobStatus.FAILED


def test_a_crash_is_call_failed_without_a_traceback(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", {"steps": 1, "stepMs": 1, "mode": "crash"}, call_id=call_id)
    response = rpc.response(request_id)
    data = assert_error(response, -32001, "OPERATION_FAILED")
    assert data["callId"] == call_id
    assert data["retryable"] is False
    assert "Traceback" not in json.dumps(response)
    assert "asked to crash" not in json.dumps(response)
    assert "asked to crash" in job_of(rpc, call_id).error_traceback


def test_a_rate_limited_call_is_call_failed_with_retry_after(stack: Stack) -> None:
    key = agent_keys.create_key("rpc-rate", calls_per_minute=1)[1]
    refused_call = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url), key=key) as agent:
        agent.start()
        agent.result(agent.call("test.sleep", SHORT))
        response = agent.response(agent.call("test.sleep", SHORT, call_id=refused_call))
    data = assert_error(response, -32001, "RATE_LIMITED")
    assert data["retryable"] is True
    assert 0 < data["retryAfter"] <= 60_000
    assert data["details"] == {"limit": "callsPerMinute", "max": 1}
    assert not Job.objects.filter(call_id=refused_call).exists()


def test_a_reused_call_id_is_invalid_params(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    rpc.result(rpc.call("test.sleep", SHORT, call_id=call_id))
    data = assert_error(
        rpc.response(rpc.call("test.sleep", SHORT, call_id=call_id)), -32602, "INVALID_PARAMS"
    )
    assert data["details"]["path"] == "params.callId"
    assert Job.objects.filter(session_id=rpc.session_id, call_id=call_id).count() == 1


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (None, "missing-credentials"),
        ("not-a-key-at-all", "invalid-credentials"),
        ("abp_0000000000_" + "x" * 43, "invalid-credentials"),
    ],
    ids=["no-key", "garbage-key", "unknown-key"],
)
def test_a_refused_credential_is_minus_32000_with_a_null_id_then_closed(
    stack: Stack, key: str | None, reason: str
) -> None:
    with RpcAgent(rpc_url(stack.ws_url), key=key) as agent:
        data, code = refusal(agent)
    assert data["details"] == {"reason": reason, "closeCode": 4401}
    assert code == 4401


def test_a_revoked_key_is_refused_at_connect(stack: Stack) -> None:
    key = agent_keys.create_key("rpc-revoked-before")[1]
    key_revocation.revoke(AgentKey.objects.filter(prefix=agent_keys.prefix_of(key)))
    with RpcAgent(rpc_url(stack.ws_url), key=key) as agent:
        data, code = refusal(agent)
    assert data["details"] == {"reason": "key-revoked", "closeCode": 4403}
    assert code == 4403


def test_a_disallowed_browser_origin_is_refused_at_the_upgrade(stack: Stack) -> None:
    with pytest.raises(InvalidStatus) as refused:
        RpcAgent(rpc_url(stack.ws_url), additional_headers={"Origin": "https://evil.example"})
    assert refused.value.response.status_code == 403


def test_the_key_may_come_as_a_bearer_subprotocol(stack: Stack) -> None:
    key = os.environ["ABP_TEST_AGENT_KEY"]
    with RpcAgent(rpc_url(stack.ws_url), key=None, subprotocols=[f"abp.bearer.{key}"]) as agent:
        result = agent.start()
    row = AgentSession.objects.get(pk=result["_meta"]["abp/sessionId"])
    assert (row.auth, row.door) == ("key", "rpc")


def test_a_refused_resume_is_resource_not_found(stack: Stack, rpc: RpcAgent) -> None:
    assert rpc.session_id is not None
    with RpcAgent(rpc_url(stack.ws_url)) as other:
        wrong_token = other.initialize(resume=(rpc.session_id, "not-the-token"), request_id=1)
        assert wrong_token["id"] == 1
        assert_error(wrong_token, -32002, "SESSION_INVALID")
    with RpcAgent(rpc_url(stack.ws_url)) as other:
        no_session = other.initialize(resume=("not-a-uuid", "x"), request_id=2)
        assert_error(no_session, -32002, "SESSION_INVALID")
    # The session itself is untouched.
    assert_healthy(rpc)


def test_an_oversized_frame_closes_with_1009(rpc: RpcAgent) -> None:
    padding = "x" * (2 * 1024 * 1024)
    rpc.send({"jsonrpc": "2.0", "id": 1, "method": "_abp/capabilities/list", "pad": padding})
    with pytest.raises(ConnectionClosed) as closed:
        rpc.receive(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


# -- ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_id",
    ["abc", "x" * 200, "é" * 50, "日本語" * 10, "7", 0, -5, 2**60, 1.5, 7],
    ids=[
        "string",
        "string-200",
        "accents-50",
        "cjk-30",
        "string-7",
        "zero",
        "negative",
        "2**60",
        "float",
        "int-7",
    ],
)
def test_ids_are_echoed_exactly(rpc: RpcAgent, request_id: str | int | float) -> None:
    rpc.request("_abp/capabilities/list", {}, request_id)
    raw = rpc.receive_text()
    response = rpc.inbox[-1]
    assert same_id(response["id"], request_id), raw[:300]
    assert "result" in response
    if not isinstance(request_id, str):
        # Byte for byte too: no float for an integer, no rounding of a big one.
        assert re.search(rf'"id":\s*{re.escape(json.dumps(request_id))}\s*[,}}]', raw), raw[:100]


def test_a_string_and_a_number_are_different_ids(stack: Stack, rpc: RpcAgent) -> None:
    call_id = new_call_id()
    rpc.call("test.sleep", LONG, call_id=call_id, request_id=7)
    wait_running(rpc, call_id)
    # "7" is not in flight, 7 is.
    assert "capabilities" in rpc.result(rpc.request("_abp/capabilities/list", {}, "7"))
    rpc.cancel_request("7")
    rpc.cancel_request(7.5)
    assert_healthy(rpc)
    assert job_of(rpc, call_id).status == JobStatus.RUNNING
    assert rpc.responses_to(7) == []
    rpc.cancel_request(7)
    assert_cancelled(rpc.response(7), call_id)
    wait_stopped_by_cancel(stack, rpc, call_id)


# -- initialize ---------------------------------------------------------------------------


def test_initialize_result_has_the_session_and_the_capabilities(stack: Stack) -> None:
    with RpcAgent(rpc_url(stack.ws_url)) as agent:
        response = agent.initialize(request_id="init")
    assert response["jsonrpc"] == "2.0"
    assert response["id"] == "init"
    result = response["result"]
    assert result["protocolVersion"] == 1
    assert isinstance(result["agentInfo"], dict)
    assert result["authMethods"] == []
    capabilities = result["agentCapabilities"]
    assert capabilities["loadSession"] is False
    jobs = capabilities["_meta"]["abp.jobs"]
    assert "protocolVersion" in jobs
    by_name = {entry["name"]: entry for entry in jobs["capabilities"]}
    assert by_name["test.sleep"] == {"name": "test.sleep", "available": True}
    assert "export.pdf" in by_name
    # The session is a real row, of this door, with its resume token kept only hashed.
    session_id = uuid.UUID(result["_meta"]["abp/sessionId"])
    token = result["_meta"]["abp/resumeToken"]
    assert isinstance(token, str)
    assert len(token) >= 40
    row = AgentSession.objects.get(pk=session_id)
    assert row.door == "rpc"
    assert row.resume_hash == hashlib.sha256(token.encode()).hexdigest()


def test_capabilities_list_matches_the_registry(rpc: RpcAgent) -> None:
    result = rpc.result(rpc.request("_abp/capabilities/list"))
    by_name = {entry["name"]: entry for entry in result["capabilities"]}
    sleep = registry.require("test.sleep")
    assert by_name["test.sleep"] == {**sleep.describe(), "available": True}
    assert by_name["test.sleep"]["inputSchema"]["properties"]["steps"]["type"] == "integer"
    for entry in by_name.values():
        assert set(entry) >= {"name", "description", "inputSchema", "outputSchema", "timeout"}


# -- calls --------------------------------------------------------------------------------


def test_a_call_answers_with_its_call_id_data_and_duration(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    params = {**SHORT, "echo": {"hello": [1, "two"]}}
    result = rpc.result(rpc.call("test.sleep", params, call_id=call_id))
    assert set(result) == {"callId", "data", "metadata"}
    assert result["callId"] == call_id
    assert result["data"] == {"echo": {"hello": [1, "two"]}, "steps": 2}
    assert isinstance(result["metadata"]["duration"], int | float)
    assert result["metadata"]["duration"] >= 0
    # Without a progressToken, no progress.
    assert rpc.notifications("_abp/progress") == []
    job = job_of(rpc, call_id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.delivered_at is not None
    # Without a callId, the server makes one.
    generated = rpc.result(rpc.call("test.sleep", SHORT))
    uuid.UUID(generated["callId"])
    assert job_of(rpc, generated["callId"]).status == JobStatus.SUCCEEDED


def test_progress_reaches_the_agent_with_its_token_and_call(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call(
        "test.sleep", {"steps": 3, "stepMs": 10}, call_id=call_id, progress_token="tok-1"
    )
    rpc.result(request_id)
    progress = [
        m["params"]
        for m in rpc.notifications("_abp/progress")
        if m["params"].get("status") != "queued"  # only if the workers were busy
    ]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    for note in progress:
        assert note["progressToken"] == "tok-1"
        assert note["callId"] == call_id
        assert note["total"] == 3
        assert note["stage"] == "sleeping"
        assert note["status"] == "running"
    assert progress[-1]["percentage"] == 100.0
    # All of it before the response.
    answer = rpc.responses_to(request_id)[0]
    last_progress = max(i for i, m in enumerate(rpc.inbox) if m.get("method") == "_abp/progress")
    assert last_progress < rpc.inbox.index(answer)
    assert all(m["jsonrpc"] == "2.0" and "id" not in m for m in rpc.notifications("_abp/progress"))


def test_a_queued_call_says_so_in_its_progress(stack: Stack) -> None:
    key = agent_keys.create_key("rpc-line", max_concurrent_calls=1)[1]
    first, second = new_call_id(), new_call_id()
    with RpcAgent(rpc_url(stack.ws_url), key=key) as agent:
        agent.start()
        running = agent.call("test.sleep", LONG, call_id=first)
        wait_running(agent, first)
        waiting = agent.call("test.sleep", SHORT, call_id=second, progress_token="line")
        queued = agent.notification("_abp/progress")["params"]
        assert queued["progressToken"] == "line"
        assert queued["callId"] == second
        assert (queued["stage"], queued["status"], queued["position"]) == ("queued", "queued", 1)
        assert queued["progress"] == 0
        # A queued call cancelled by its request id never starts.
        never = new_call_id()
        behind = agent.call("test.sleep", SHORT, call_id=never)
        wait_job(agent, never)
        agent.cancel_request(behind)
        assert_cancelled(agent.response(behind), never)
        agent.cancel_request(running)
        assert_cancelled(agent.response(running), first)
        assert agent.result(waiting)["callId"] == second
        # Its slot came and went: the cancelled one still never ran.
        assert job_of(agent, never).started_at is None


def test_operation_notifications_only_when_asked(stack: Stack) -> None:
    call_id = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url)) as agent:
        agent.start(notifications=True)
        agent.result(agent.call("test.sleep", SHORT, call_id=call_id))
        agent.notification("_abp/operation/completed")
        started = [m["params"] for m in agent.notifications("_abp/operation/started")]
        completed = [m["params"] for m in agent.notifications("_abp/operation/completed")]
        assert [p["operationId"] for p in started] == [call_id]
        assert [p["operationId"] for p in completed] == [call_id]
    with RpcAgent(rpc_url(stack.ws_url)) as quiet:
        quiet.start()
        quiet.result(quiet.call("test.sleep", SHORT))
        quiet.drain(0.3)
        assert not [m for m in quiet.inbox if str(m.get("method", "")).startswith("_abp/op")]


# -- cancelling ---------------------------------------------------------------------------


def test_abp_cancel_confirms_then_answers_the_call_cancelled(stack: Stack, rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id)
    wait_running(rpc, call_id)

    cancel = rpc.cancel(call_id, reason="user clicked stop")
    confirmation = rpc.response(cancel)
    answer = rpc.response(request_id)

    assert confirmation["result"] == {"callId": call_id, "cancelled": True}
    assert_cancelled(answer, call_id)
    assert rpc.inbox.index(confirmation) < rpc.inbox.index(answer)
    job = wait_stopped_by_cancel(stack, rpc, call_id)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "user clicked stop"
    rpc.drain(0.3)
    assert len(rpc.responses_to(request_id)) == 1


def test_abp_cancel_of_an_unknown_or_finished_call_cancels_nothing(rpc: RpcAgent) -> None:
    unknown = rpc.result(rpc.cancel("never-called"))
    assert unknown == {
        "callId": "never-called",
        "cancelled": False,
        "reason": "Operation not found",
    }

    call_id = new_call_id()
    request_id = rpc.call("test.sleep", SHORT, call_id=call_id)
    rpc.result(request_id)
    finished = rpc.result(rpc.cancel(call_id))
    assert finished == {
        "callId": call_id,
        "cancelled": False,
        "reason": "Operation already completed",
    }
    rpc.drain(0.3)
    assert len(rpc.responses_to(request_id)) == 1
    assert job_of(rpc, call_id).status == JobStatus.SUCCEEDED


def test_abp_cancel_twice_confirms_twice_with_one_answer(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id)
    wait_running(rpc, call_id)
    first, second = rpc.cancel(call_id), rpc.cancel(call_id)
    assert rpc.result(first) == {"callId": call_id, "cancelled": True}
    assert rpc.result(second) == {"callId": call_id, "cancelled": True}
    assert_cancelled(rpc.response(request_id), call_id)
    rpc.drain(0.3)
    assert len(rpc.responses_to(request_id)) == 1


def test_abp_cancel_cannot_reach_another_sessions_call(stack: Stack, rpc: RpcAgent) -> None:
    call_id = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url)) as owner:
        owner.start()
        request_id = owner.call("test.sleep", {"steps": 20, "stepMs": 20}, call_id=call_id)
        wait_running(owner, call_id)
        attempt = rpc.result(rpc.cancel(call_id))
        assert attempt == {"callId": call_id, "cancelled": False, "reason": "Operation not found"}
        # The owner's call runs to its end, untouched.
        assert owner.result(request_id)["callId"] == call_id
    assert rpc.notifications("_abp/result") == []


def test_cancel_request_answers_the_call_cancelled_exactly_once(
    stack: Stack, rpc: RpcAgent
) -> None:
    call_id = new_call_id()
    rpc.call("test.sleep", LONG, call_id=call_id, request_id=11)
    wait_running(rpc, call_id)

    rpc.cancel_request(11)
    assert_cancelled(rpc.response(11), call_id)
    # A second cancel of the same (now finished) request changes nothing.
    rpc.cancel_request(11)
    rpc.drain(0.5)
    assert len(rpc.responses_to(11)) == 1
    job = wait_stopped_by_cancel(stack, rpc, call_id)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT


def test_cancel_request_of_an_unknown_or_finished_id_is_ignored(rpc: RpcAgent) -> None:
    rpc.cancel_request(999)
    rpc.cancel_request("never-sent")
    assert_healthy(rpc)

    call_id = new_call_id()
    request_id = rpc.call("test.sleep", SHORT, call_id=call_id)
    assert rpc.result(request_id)["callId"] == call_id
    rpc.cancel_request(request_id)
    assert_healthy(rpc)
    assert len(rpc.responses_to(request_id)) == 1
    assert job_of(rpc, call_id).status == JobStatus.SUCCEEDED


def test_cancel_request_racing_the_end_of_a_call_gives_one_consistent_answer(
    rpc: RpcAgent,
) -> None:
    # From "cancelled before it starts" to "done before the cancel arrives".
    for delay in (0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.1, 0.3):
        call_id = new_call_id()
        request_id = rpc.call("test.sleep", {"steps": 4, "stepMs": 5}, call_id=call_id)
        time.sleep(delay)
        rpc.cancel_request(request_id)
        rpc.response(request_id)
        rpc.drain(0.05)
        [answer] = rpc.responses_to(request_id)
        job = wait_job(rpc, call_id, settled_at__isnull=False)
        if "result" in answer:
            assert answer["result"]["callId"] == call_id
            assert job.status == JobStatus.SUCCEEDED
        else:
            assert_cancelled(answer, call_id)
            assert job.status == JobStatus.CANCELLED
            assert job.cancel_source == CancelSource.AGENT
    rpc.drain(0.3)
    assert all(len(rpc.responses_to(m["id"])) == 1 for m in rpc.inbox if is_response(m))


# -- cancels the agent did not ask for ----------------------------------------------------


def test_a_timeout_answers_minus_32800_timeout(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id, timeout_ms=300)
    data = assert_error(rpc.response(request_id), -32800, "TIMEOUT")
    assert data["callId"] == call_id
    assert data["retryable"] is True
    assert data["details"] == {"source": "timeout"}
    job = wait_job(rpc, call_id, stopped_at__isnull=False)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.TIMEOUT


def test_an_operators_cancel_answers_minus_32800(stack: Stack, rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id)
    job = wait_running(rpc, call_id)
    assert cancellation.cancel(job.id, source=CancelSource.OPERATOR, reason="by an operator")
    assert_cancelled(rpc.response(request_id), call_id, "operator")
    done = wait_stopped_by_cancel(stack, rpc, call_id)
    assert (done.status, done.cancel_source) == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    rpc.drain(0.3)
    assert len(rpc.responses_to(request_id)) == 1


def test_shutdown_answers_calls_in_flight_then_itself_then_closes(
    stack: Stack, rpc: RpcAgent
) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id)
    wait_running(rpc, call_id)
    session_id, token = rpc.session_id, rpc.resume_token
    assert session_id is not None
    assert token is not None

    shutdown = rpc.request("_abp/shutdown", {"reason": "done for today"})
    code = rpc.read_until_closed()

    assert code == 1000
    [answer] = rpc.responses_to(request_id)
    assert_cancelled(answer, call_id, "shutdown")
    [reply] = rpc.responses_to(shutdown)
    assert reply["result"] == {}
    assert rpc.inbox.index(answer) < rpc.inbox.index(reply)
    job = wait_job(rpc, call_id, stopped_at__isnull=False)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.SHUTDOWN)
    # A shutdown ends the session for good.
    with RpcAgent(rpc_url(stack.ws_url)) as later:
        refused = later.initialize(resume=(session_id, token))
        error = refused["error"]
        assert error["code"] == -32002, refused
        assert error["data"]["code"] in ("SESSION_INVALID", "SESSION_EXPIRED")


def test_shutdown_as_a_notification_answers_calls_then_closes(rpc: RpcAgent) -> None:
    call_id = new_call_id()
    request_id = rpc.call("test.sleep", LONG, call_id=call_id)
    wait_running(rpc, call_id)
    rpc.notify("_abp/shutdown", {})
    assert rpc.read_until_closed() == 1000
    [answer] = rpc.responses_to(request_id)
    assert_cancelled(answer, call_id, "shutdown")
    # Nothing answers the notification itself.
    assert [m for m in rpc.inbox if is_response(m)][-1] == answer
    job = wait_job(rpc, call_id, stopped_at__isnull=False)
    assert job.cancel_source == CancelSource.SHUTDOWN


def test_revoking_the_key_answers_calls_then_minus_32000_then_closes(stack: Stack) -> None:
    key = agent_keys.create_key("rpc-revoked-mid-call")[1]
    call_id = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url), key=key) as agent:
        agent.start()
        request_id = agent.call("test.sleep", LONG, call_id=call_id)
        wait_running(agent, call_id)

        key_revocation.revoke(AgentKey.objects.filter(prefix=agent_keys.prefix_of(key)))

        answer = agent.response(request_id)
        assert_cancelled(answer, call_id, "operator")
        data, code = refusal(agent)
        assert data["details"] == {"reason": "key-revoked", "closeCode": 4403}
        assert code == 4403
        assert len(agent.responses_to(request_id)) == 1
        job = wait_job(agent, call_id, stopped_at__isnull=False)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.OPERATOR)


# -- resuming -----------------------------------------------------------------------------


def dropped_with_a_call(stack: Stack, params: dict[str, Any]) -> tuple[uuid.UUID, str, str, int]:
    """A session whose connection dropped with a call running: its id, token, callId, id."""
    call_id = new_call_id()
    with RpcAgent(rpc_url(stack.ws_url)) as first:
        first.start()
        request_id = first.call("test.sleep", params, call_id=call_id, request_id=5)
        wait_running(first, call_id)
        assert first.session_id is not None
        assert first.resume_token is not None
        session_id, token = first.session_id, first.resume_token
        # Gone before the result (the call runs on).
        assert first.responses_to(request_id) == []
    eventually(AgentSession.objects.filter(pk=session_id, detached_at__isnull=False).first)
    return session_id, token, call_id, request_id


def test_a_resumed_session_gets_the_result_as_abp_result_once(stack: Stack) -> None:
    session_id, token, call_id, request_id = dropped_with_a_call(
        stack, {"steps": 25, "stepMs": 20, "echo": "kept"}
    )
    with RpcAgent(rpc_url(stack.ws_url)) as second:
        result = second.start(resume=(session_id, token))
        assert result["_meta"]["abp/sessionId"] == str(session_id)
        assert result["_meta"]["abp/resumeToken"] != token
        note = second.notification("_abp/result", timeout=15)
        second.drain(0.5)
        assert note["jsonrpc"] == "2.0"
        assert "id" not in note
        params = note["params"]
        assert params["callId"] == call_id
        assert same_id(params["requestId"], request_id)
        assert "error" not in params
        assert params["result"]["callId"] == call_id
        assert params["result"]["data"] == {"echo": "kept", "steps": 25}
        assert len(second.notifications("_abp/result")) == 1
        # Request ids belong to their connection: nothing answers 5 here.
        assert second.responses_to(request_id) == []
    job = Job.objects.get(session_id=session_id, call_id=call_id)
    assert job.delivered_at is not None
    assert AgentSession.objects.get(pk=session_id).door == "rpc"


def test_a_resume_lists_the_held_calls_and_a_resent_call_runs_once(stack: Stack) -> None:
    three_seconds = {"steps": 150, "stepMs": 20}
    session_id, token, call_id, _ = dropped_with_a_call(stack, three_seconds)
    with RpcAgent(rpc_url(stack.ws_url)) as second:
        result = second.start(resume=(session_id, token), awaiting=[call_id, "never-sent"])
        assert result["_meta"]["abp/heldCalls"] == [call_id]
        params = {"capability": "test.sleep", "params": {"steps": 1}, "callId": "never-sent"}
        sent = second.request("_abp/call", {**params, "_meta": {"abp/resent": True}})
        assert second.response(sent, timeout=15)["result"]["callId"] == "never-sent"
        # The call it holds, sent again: adopted, not run twice, answered once.
        again = {"capability": "test.sleep", "params": three_seconds, "callId": call_id}
        second.request("_abp/call", {**again, "_meta": {"abp/resent": True}})
        assert second.notification("_abp/result", timeout=15)["params"]["callId"] == call_id
        second.drain(0.5)
        assert len(second.notifications("_abp/result")) == 1
    assert Job.objects.filter(session_id=session_id, call_id=call_id).count() == 1
    assert Job.objects.filter(session_id=session_id, call_id="never-sent").count() == 1


def test_abp_cancel_reaches_a_call_adopted_by_a_resume(stack: Stack) -> None:
    session_id, token, call_id, request_id = dropped_with_a_call(stack, LONG)
    with RpcAgent(rpc_url(stack.ws_url)) as second:
        second.start(resume=(session_id, token))
        # Request ids belong to their connection: 5 is free here, and cancelling "5"
        # names nothing on this one.
        assert "capabilities" in second.result(second.request("_abp/capabilities/list", {}, 5))
        second.cancel_request(request_id)
        assert_healthy(second)
        assert Job.objects.get(session_id=session_id, call_id=call_id).status == JobStatus.RUNNING
        confirmation = second.result(second.cancel(call_id))
        assert confirmation == {"callId": call_id, "cancelled": True}
        note = second.notification("_abp/result")
        second.drain(0.5)
        params = note["params"]
        assert params["callId"] == call_id
        assert same_id(params["requestId"], request_id)
        assert "result" not in params
        assert params["error"]["code"] == -32800
        assert params["error"]["data"]["code"] == "CANCELLED"
        assert len(second.notifications("_abp/result")) == 1
        job = wait_job(second, call_id, stopped_at__isnull=False)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)


def test_shutdown_answers_a_call_adopted_by_a_resume(stack: Stack) -> None:
    session_id, token, call_id, request_id = dropped_with_a_call(stack, LONG)
    with RpcAgent(rpc_url(stack.ws_url)) as second:
        second.start(resume=(session_id, token))
        shutdown = second.request("_abp/shutdown", {})
        assert second.read_until_closed() == 1000
        [note] = second.notifications("_abp/result")
        assert note["params"]["callId"] == call_id
        assert same_id(note["params"]["requestId"], request_id)
        assert note["params"]["error"]["code"] == -32800
        assert note["params"]["error"]["data"]["code"] == "CANCELLED"
        [reply] = second.responses_to(shutdown)
        assert reply["result"] == {}
        assert second.inbox.index(note) < second.inbox.index(reply)
    job = eventually(
        Job.objects.filter(session_id=session_id, call_id=call_id, stopped_at__isnull=False).first
    )
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.SHUTDOWN)
