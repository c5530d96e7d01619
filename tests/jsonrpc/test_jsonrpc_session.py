"""The session spoken as JSON-RPC (capabilities/jsonrpc/): frames in, actions out. Pure.

The session is the one /abp/ws runs; these tests feed it JSON-RPC frames through
the door's codec and read the JSON-RPC messages its wire writes: `$/cancel_request`,
ids in flight, adopted calls, shutdown, refusals, and the error table.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from capabilities.jsonrpc import codec, error_codes, replies
from capabilities.protocol import (
    CallRequest,
    CancelPendingRequest,
    ErrorCode,
    Initialize,
    ListCapabilities,
    Message,
    ProtocolError,
    Shutdown,
    WireError,
    responses,
)
from capabilities.session.actions import (
    Action,
    CallRecord,
    CancelStart,
    ClaimResult,
    Close,
    EndAll,
    EndSession,
    FindUnanswered,
    Limits,
    OpenSession,
    ResumeSession,
    Send,
    SettleCancels,
    StartCall,
    StopWork,
)
from capabilities.session.machine import ConnectionState, Session

NAMES = ["export.pdf", "test.sleep"]
APP = {"id": "abp-jobs", "name": "ABP Jobs", "version": "0.1.0", "description": "Jobs."}
ENTRIES = [{"name": "test.sleep", "inputSchema": {"type": "object"}, "available": True}]


def new_session() -> Session:
    numbers = itertools.count(1)
    return Session(
        capability_names=lambda: list(NAMES),
        app=dict(APP),
        wire=replies,
        describe=lambda: list(ENTRIES),
        new_id=lambda: f"id-{next(numbers)}",
        new_token=lambda: "token",
    )


def frame(method: str, params: dict[str, Any] | None = None, **envelope: Any) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **envelope}
    if params is not None:
        message["params"] = params
    return json.dumps(message)


def read(text: str) -> Message | ProtocolError | None:
    """What the consumer hands the session for one frame."""
    try:
        return codec.decode(text)
    except ProtocolError as error:
        return error


def feed(session: Session, text: str) -> list[Action]:
    message = read(text)
    return [] if message is None else session.receive(message)


def messages(actions: list[Action]) -> list[dict[str, Any]]:
    """The JSON-RPC messages the actions send, in order."""
    out = []
    for action in actions:
        if isinstance(action, Send):
            parsed = json.loads(action.text)
            assert parsed["jsonrpc"] == "2.0"
            out.append(parsed)
    return out


def one(actions: list[Action]) -> dict[str, Any]:
    [message] = messages(actions)
    return message


def opened(resumable: bool = False) -> Session:
    session = new_session()
    session.accepted(Limits(resumable=resumable))
    [action] = feed(session, frame("initialize", {"protocolVersion": 1}, id=0))
    assert isinstance(action, OpenSession)
    answer = one(session.opened(action))
    assert answer["id"] == 0
    assert answer["result"]["_meta"]["abp/sessionId"] == action.session_id
    return session


def record(call_id: str, request_id: Any, job_id: str = "job-1") -> CallRecord:
    return CallRecord(
        call_id=call_id,
        request_id=replies.store_id(request_id),
        job_id=job_id,
        progress_token=None,
        status="running",
        active=True,
        delivered=False,
        seconds_left=30.0,
    )


def started(session: Session, request_id: Any, call_id: str, job_id: str = "job-1") -> None:
    """Send a call with this id and report its job created."""
    params = {"capability": "test.sleep", "params": {}, "callId": call_id}
    [action] = feed(session, frame("_abp/call", params, id=request_id))
    assert isinstance(action, StartCall)
    assert action.request_id == request_id
    assert action.stored_request_id == json.dumps(request_id)
    session.call_started(record(call_id, request_id, job_id))


def test_initialize_answers_acp_style_with_the_session_under_meta() -> None:
    session = new_session()
    session.accepted(Limits())
    params = {"protocolVersion": 1, "clientInfo": {"name": "acp-client", "version": "2"}}
    [action] = feed(session, frame("initialize", params, id="i"))
    assert isinstance(action, OpenSession)
    assert action.message.agent.name == "acp-client"
    result = one(session.opened(action))["result"]
    assert result["protocolVersion"] == 1
    assert result["agentInfo"] == {"name": "abp-jobs", "title": "ABP Jobs", "version": "0.1.0"}
    jobs = result["agentCapabilities"]["_meta"]["abp.jobs"]
    assert [entry["name"] for entry in jobs["capabilities"]] == NAMES
    assert result["_meta"] == {"abp/sessionId": "id-1", "abp/resumeToken": "token"}


def test_initialize_with_abp_resume_meta_resumes() -> None:
    session = new_session()
    session.accepted(Limits(resumable=True))
    resume = {"abp/resume": {"sessionId": "s-1", "token": "t"}}
    [action] = feed(session, frame("initialize", {"protocolVersion": 1, "_meta": resume}, id=1))
    assert action == ResumeSession(session_id="s-1", token="t")


@pytest.mark.parametrize("request_id", ["a", "", 0, -3, 2**60, 1.5])
def test_ids_are_echoed_exactly(request_id: Any) -> None:
    session = opened()
    [answer] = messages(feed(session, frame("_abp/capabilities/list", id=request_id)))
    assert answer["id"] == request_id
    assert type(answer["id"]) is type(request_id)
    assert answer["result"] == {"capabilities": ENTRIES}


def test_cancel_request_settles_the_call_its_request_made_and_answers_it_cancelled() -> None:
    session = opened()
    started(session, 7, "c-7", "job-7")
    [settle] = feed(session, frame("$/cancel_request", {"requestId": 7}))
    assert settle == SettleCancels(
        call_ids=("c-7",),
        job_ids=("job-7",),
        source="agent",
        reason="$/cancel_request",
        delivered=True,
    )
    actions = session.cancels_settled(settle, {"job-7": True})
    [answer] = messages(actions)
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32800
    assert answer["error"]["data"]["code"] == "CANCELLED"
    assert answer["error"]["data"]["callId"] == "c-7"
    assert answer["error"]["data"]["details"] == {"source": "agent"}
    assert StopWork(job_id="job-7") in actions
    # Answered: a second cancel changes nothing, and the id is free again.
    assert feed(session, frame("$/cancel_request", {"requestId": 7})) == []
    started(session, 7, "c-8", "job-8")


def test_cancel_request_of_a_call_being_started_answers_only_the_request() -> None:
    session = opened()
    params = {"capability": "test.sleep", "params": {}, "callId": "c-7"}
    [start] = feed(session, frame("_abp/call", params, id=7))
    assert isinstance(start, StartCall)
    [cancel] = feed(session, frame("$/cancel_request", {"requestId": 7}))
    assert isinstance(cancel, CancelStart)
    assert cancel.call_id == "c-7"
    # Won: answered once the call's row is written (settled cancelled, delivered).
    assert session.start_ticket(cancel, won=True) == []
    [answer] = messages(session.call_started(record("c-7", 7)))
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32800
    assert answer["error"]["data"]["details"] == {"source": "agent"}
    # The id is free again.
    started(session, 7, "c-8", "job-8")


def test_cancel_request_that_loses_delivers_the_normal_result() -> None:
    session = opened()
    started(session, "r", "c-1")
    [settle] = feed(session, frame("$/cancel_request", {"requestId": "r"}))
    assert isinstance(settle, SettleCancels)
    # The job had succeeded already: its result is claimed and sent as usual.
    [claim] = session.cancels_settled(settle, {"job-1": False})
    assert claim == ClaimResult(call_id="c-1", job_id="job-1", response=None)
    succeeded = responses.succeeded("c-1", {"ok": True}, 5)
    [answer] = messages(session.result_claimed(claim, succeeded))
    assert answer == {
        "jsonrpc": "2.0",
        "id": "r",
        "result": {"callId": "c-1", "data": {"ok": True}, "metadata": {"duration": 5}},
    }


@pytest.mark.parametrize(
    "params",
    [{"requestId": 99}, {"requestId": "7"}, {"requestId": None}, {}, {"requestId": [7]}],
)
def test_cancel_request_of_an_unknown_or_malformed_id_is_ignored(params: Any) -> None:
    session = opened()
    started(session, 7, "c-7")
    assert feed(session, frame("$/cancel_request", params)) == []


def test_cancel_request_before_initialize_is_ignored() -> None:
    session = new_session()
    session.accepted(Limits())
    assert feed(session, frame("$/cancel_request", {"requestId": 1})) == []


def test_a_request_id_in_flight_cannot_be_reused() -> None:
    session = opened()
    started(session, 7, "c-7")
    for method, params in [
        ("_abp/call", {"capability": "test.sleep"}),
        ("_abp/cancel", {"callId": "c-7"}),
        ("_abp/capabilities/list", None),
    ]:
        answer = one(feed(session, frame(method, params, id=7)))
        assert answer["id"] == 7
        assert answer["error"]["code"] == -32600
        assert answer["error"]["data"]["code"] == "INVALID_REQUEST"
    # "7" is another id.
    assert one(feed(session, frame("_abp/capabilities/list", id="7")))["id"] == "7"


def test_a_call_adopted_by_a_resume_is_answered_as_an_abp_result_notification() -> None:
    session = new_session()
    session.accepted(Limits(resumable=True))
    resume = {"abp/resume": {"sessionId": "s-1", "token": "t"}}
    [action] = feed(session, frame("initialize", {"_meta": resume}, id="new-0"))
    assert isinstance(action, ResumeSession)
    earlier = record("c-1", 4)
    actions = session.resumed(action, token="t2", generation=2, was_held=False, calls=[earlier])
    assert one(actions)["id"] == "new-0"
    session.job_settled("c-1", None)
    claim = ClaimResult(call_id="c-1", job_id="job-1", response=None)
    failed = responses.failed("c-1", WireError(code="WORKER_LOST", message="Lost."), 9)
    note = one(session.result_claimed(claim, failed))
    assert note["method"] == "_abp/result"
    assert "id" not in note
    assert note["params"]["callId"] == "c-1"
    assert note["params"]["requestId"] == 4
    assert note["params"]["error"]["code"] == -32001
    assert note["params"]["error"]["data"]["code"] == "WORKER_LOST"
    # Its old request id is not this connection's: reusing it is fine.
    assert one(feed(session, frame("_abp/capabilities/list", id=4)))["id"] == 4


def test_shutdown_request_ends_the_calls_then_answers_then_closes() -> None:
    session = opened()
    started(session, 1, "c-1")
    actions = feed(session, frame("_abp/shutdown", {"reason": "done"}, id=2))
    assert isinstance(actions[0], EndSession)
    assert actions[1] == FindUnanswered(then=EndAll(source="shutdown", reason="done"))
    assert one(actions[2:3]) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert actions[3] == Close(code=1000)
    assert session.state is ConnectionState.ENDING


def test_shutdown_notification_is_not_answered() -> None:
    session = opened()
    actions = feed(session, frame("_abp/shutdown"))
    assert messages(actions) == []
    assert actions[-1] == Close(code=1000)


def test_requests_before_initialize_are_refused_but_notifications_are_not_answered() -> None:
    session = new_session()
    session.accepted(Limits())
    answer = one(feed(session, frame("_abp/call", {"capability": "test.sleep"}, id=3)))
    assert answer["error"]["code"] == -32600
    assert answer["error"]["data"]["code"] == "NOT_INITIALIZED"
    assert feed(session, frame("_abp/shutdown")) == []
    assert feed(session, frame("_abp/whatever")) == []


def test_a_refused_connection_says_why_with_id_null() -> None:
    session = new_session()
    actions = session.refuse("invalid-credentials")
    answer = one(actions)
    assert answer["id"] is None
    assert answer["error"]["code"] == -32000
    assert answer["error"]["data"]["details"]["reason"] == "invalid-credentials"
    assert isinstance(actions[-1], Close)


def test_progress_names_the_token_and_the_call() -> None:
    session = opened()
    params = {"capability": "test.sleep", "callId": "c-1", "_meta": {"progressToken": "p"}}
    [action] = feed(session, frame("_abp/call", params, id=1))
    assert isinstance(action, StartCall)
    assert action.progress_token == "p"
    session.call_started(
        CallRecord(
            call_id="c-1",
            request_id=action.stored_request_id,
            job_id="job-1",
            progress_token="p",
            status="running",
            active=True,
            delivered=False,
            seconds_left=30.0,
        )
    )
    note = one(session.job_progress("c-1", progress=1, total=4, stage="sleeping"))
    assert note["method"] == "_abp/progress"
    assert note["params"] == {
        "progressToken": "p",
        "callId": "c-1",
        "progress": 1,
        "total": 4,
        "percentage": 25.0,
        "stage": "sleeping",
        "status": "running",
    }


# -- the codec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", ErrorCode.PARSE_ERROR),
        ("[]", ErrorCode.INVALID_REQUEST),
        ('[{"jsonrpc": "2.0", "id": 1, "method": "initialize"}]', ErrorCode.INVALID_REQUEST),
        ('"text"', ErrorCode.INVALID_REQUEST),
        ('{"foo": "boo"}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": null, "method": "initialize"}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": true, "method": "initialize"}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": {}, "method": "initialize"}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "1.0", "id": 1, "method": "initialize"}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": 1, "method": 5}', ErrorCode.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": 1, "method": "nope"}', ErrorCode.UNKNOWN_MESSAGE_TYPE),
        ('{"jsonrpc": "2.0", "id": 1, "method": "_abp/call", "params": [1]}', "INVALID_PARAMS"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "_abp/call", "params": {}}', "MISSING_PARAM"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "_abp/cancel", "params": {}}', "MISSING_PARAM"),
    ],
)
def test_refused_frames_carry_their_code(text: str, code: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        codec.decode(text)
    assert refused.value.code == code


@pytest.mark.parametrize("request_id", ["x" * 201, "\ud800", "a\x00b", 10**200])
def test_an_id_no_store_can_hold_is_refused(request_id: Any) -> None:
    with pytest.raises(ProtocolError) as refused:
        codec.decode(frame("initialize", id=request_id))
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    assert refused.value.request_id is None


@pytest.mark.parametrize("request_id", ["x" * 200, "é" * 200, '"\\' * 100, 10**199])
def test_ids_up_to_the_limit_are_taken_and_stored_whole(request_id: Any) -> None:
    message = codec.decode(frame("initialize", id=request_id))
    assert isinstance(message, Initialize)
    assert message.id == request_id
    stored = replies.store_id(request_id)
    assert len(stored) <= 1210  # Job.request_id
    assert replies.load_id(stored) == request_id


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"capability": "test.sleep", "timeout": "soon"}, "params.timeout"),
        (
            {"capability": "test.sleep", "_meta": {"progressToken": True}},
            "params._meta.progressToken",
        ),
        ({"capability": 3}, "params.capability"),
    ],
)
def test_bad_call_params_name_their_path(params: dict[str, Any], path: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        codec.decode(frame("_abp/call", params, id=1))
    assert refused.value.error.details == {"path": path}
    assert refused.value.request_id == 1


def test_responses_and_unknown_notifications_are_ignored() -> None:
    assert codec.decode('{"jsonrpc": "2.0", "id": 1, "result": {}}') is None
    assert codec.decode('{"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}') is None
    assert codec.decode(frame("session/update", {"x": 1})) is None
    assert codec.decode(frame("$/cancel_request", {"requestId": 1})) == CancelPendingRequest(
        request_id=1
    )
    assert codec.decode(frame("_abp/shutdown")) == Shutdown(id=None)


def test_a_call_decodes_into_the_sessions_call_request() -> None:
    params = {
        "capability": "test.sleep",
        "params": {"steps": 1},
        "callId": "c-1",
        "timeout": 2500,
        "_meta": {"progressToken": 9},
    }
    message = codec.decode(frame("_abp/call", params, id="r"))
    assert isinstance(message, CallRequest)
    assert message.params == {"steps": 1}
    assert (message.options.call_id, message.options.timeout_ms) == ("c-1", 2500)
    assert message.options.progress_token == 9
    assert isinstance(codec.decode(frame("_abp/capabilities/list", id=1)), ListCapabilities)


# -- the error table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (ErrorCode.PARSE_ERROR, -32700),
        (ErrorCode.INVALID_REQUEST, -32600),
        (ErrorCode.NOT_INITIALIZED, -32600),
        (ErrorCode.ALREADY_INITIALIZED, -32600),
        (ErrorCode.UNKNOWN_MESSAGE_TYPE, -32601),
        (ErrorCode.INVALID_PARAMS, -32602),
        (ErrorCode.MISSING_PARAM, -32602),
        (ErrorCode.INVALID_TYPE, -32602),
        (ErrorCode.UNKNOWN_CAPABILITY, -32602),
        (ErrorCode.INTERNAL_ERROR, -32603),
        (ErrorCode.CANCELLED, -32800),
        (ErrorCode.TIMEOUT, -32800),
        (ErrorCode.PERMISSION_DENIED, -32000),
        (ErrorCode.SESSION_INVALID, -32002),
        (ErrorCode.SESSION_EXPIRED, -32002),
        (ErrorCode.OPERATION_FAILED, -32001),
        (ErrorCode.WORKER_LOST, -32001),
        (ErrorCode.RATE_LIMITED, -32001),
        (ErrorCode.CAPABILITY_UNAVAILABLE, -32001),
        (ErrorCode.DISCONNECTED, -32001),
    ],
)
def test_every_abp_code_has_its_jsonrpc_code(code: ErrorCode, expected: int) -> None:
    assert error_codes.jsonrpc_error(code)[0] == expected
    answer = json.loads(replies.call_error(1, "c-1", WireError(code=code, message="m.")))
    assert answer["error"]["code"] == expected
    assert answer["error"]["data"]["code"] == code
    assert answer["error"]["data"]["callId"] == "c-1"


def test_a_retryable_failure_keeps_retryable_and_retry_after() -> None:
    error = WireError(code=ErrorCode.RATE_LIMITED, message="Slow down.", retry_after_ms=1500)
    data = json.loads(replies.call_error("r", None, error))["error"]["data"]
    assert data == {
        "code": "RATE_LIMITED",
        "message": "Slow down.",
        "retryable": True,
        "retryAfter": 1500,
    }


@pytest.mark.parametrize(
    ("abp_path", "rpc_path"),
    [
        ("payload.options.callId", "params.callId"),
        ("payload.options.timeout", "params.timeout"),
        ("params.html", "params.params.html"),
        ("params.operations[0].width", "params.params.operations[0].width"),
    ],
)
def test_call_errors_name_the_fields_as_this_door_nests_them(abp_path: str, rpc_path: str) -> None:
    error = WireError(code=ErrorCode.INVALID_PARAMS, message="Bad.", details={"path": abp_path})
    answer = json.loads(replies.call_error(1, None, error))
    assert answer["error"]["data"]["details"]["path"] == rpc_path
