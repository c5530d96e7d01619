"""The sans-I/O session: ABP messages and facts in, actions out. No socket, no database.

The unit tests feed the Session what a shell would (frames, then what each action
found) and read the envelopes it writes. Two hypothesis state machines follow: one
over the session's table of calls with arbitrary facts, and one that plays a whole
shell (sockets, timers, a job table that settles once, notes, resumes, takeovers).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from capabilities.protocol import (
    AgentInfo,
    CallOptions,
    CallRequest,
    CancelRequest,
    ElicitationResponse,
    ErrorCode,
    Features,
    Initialize,
    ListCapabilities,
    Message,
    ProtocolError,
    ResumeRequest,
    Shutdown,
    WireError,
    decode,
    replies,
    responses,
)
from capabilities.protocol.call_digest import call_digest
from capabilities.session.actions import (
    Action,
    AnnounceTakeover,
    CallRecord,
    CancelFound,
    CancelStart,
    ClaimResult,
    Close,
    DeliverFound,
    Detach,
    EndAll,
    EndSession,
    FindUnanswered,
    GiveBack,
    LetGo,
    Limits,
    LookUp,
    OpenSession,
    ResumeSession,
    Send,
    SettleCancels,
    StartCall,
    StartTimer,
    StopTimer,
    StopTimers,
    StopWork,
)
from capabilities.session.machine import (
    DELIVERED_ELSEWHERE,
    STILL_ACTIVE,
    TAKEN_OVER_CLOSE_CODE,
    Claimed,
    ConnectionState,
    Session,
)

NAMES = ["export.pdf", "process.image", "convert.markdownToHtml"]
APP = {"id": "abp-jobs", "name": "ABP Jobs", "version": "0.1.0", "description": "Jobs."}
ACTIVE = ("queued", "running")
NOTIFICATIONS = Features(notifications=True)


def counter(prefix: str = "id") -> Callable[[], str]:
    numbers: Iterator[int] = itertools.count(1)
    return lambda: f"{prefix}-{next(numbers)}"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def new_session(names: list[str] | None = None, *, clock: Clock | None = None) -> Session:
    return Session(
        capability_names=lambda: list(NAMES if names is None else names),
        app=dict(APP),
        new_id=counter(),
        new_token=counter("token"),
        clock=clock or Clock(),
    )


def connected(*, limits: Limits | None = None, clock: Clock | None = None) -> Session:
    """A session whose credential was accepted: waiting for initialize."""
    session = new_session(clock=clock)
    assert session.accepted(limits or Limits()) == []
    assert session.state is ConnectionState.NEW
    return session


def open_session(
    features: Features | None = None, *, limits: Limits | None = None, clock: Clock | None = None
) -> Session:
    session = connected(limits=limits, clock=clock)
    [action] = session.receive(Initialize(id="init", features=features or Features()))
    assert isinstance(action, OpenSession)
    assert sent(session.opened(action))["type"] == "initialize-result"
    assert session.state is ConnectionState.OPEN
    return session


def state_of(session: Session) -> ConnectionState:
    """The session's state, read afresh (mypy would keep an earlier assert's narrowing)."""
    return session.state


def envelope(action: Action) -> dict[str, Any]:
    """The envelope a Send action carries."""
    assert isinstance(action, Send), action
    parsed: dict[str, Any] = json.loads(action.text)
    assert set(parsed) == {"type", "id", "timestamp", "payload"}
    assert type(parsed["timestamp"]) is int
    return parsed


def sent(actions: list[Action]) -> dict[str, Any]:
    """The one envelope the actions send."""
    assert len(actions) == 1, actions
    return envelope(actions[0])


def refusal(text: str) -> ProtocolError:
    try:
        decode(text)
    except ProtocolError as error:
        return error
    raise AssertionError(f"{text!r} decoded")


def frame(message_type: str, payload: dict[str, Any], message_id: str = "bad-1") -> str:
    return json.dumps({"type": message_type, "id": message_id, "payload": payload})


def call(
    call_id: str | None = None,
    *,
    message_id: str = "req-1",
    capability: str = "export.pdf",
    **options: Any,
) -> CallRequest:
    return CallRequest(
        id=message_id,
        capability=capability,
        params={"html": "<p>x</p>"},
        options=CallOptions(call_id=call_id, **options),
    )


def record(
    call_id: str,
    *,
    job_id: str = "job-1",
    request_id: str = "req-1",
    status: str = "running",
    delivered: bool = False,
    seconds_left: float = 30.0,
    progress_token: str | int | None = None,
) -> CallRecord:
    return CallRecord(
        call_id=call_id,
        request_id=request_id,
        job_id=job_id,
        progress_token=progress_token,
        status=status,
        active=status in ACTIVE,
        delivered=delivered,
        seconds_left=seconds_left,
    )


def start(
    session: Session,
    call_id: str,
    *,
    job_id: str = "job-1",
    request_id: str = "req-1",
    progress_token: str | int | None = None,
) -> list[Action]:
    """Call, and report that the call service created its job."""
    [action] = session.receive(call(call_id, message_id=request_id, progress_token=progress_token))
    assert isinstance(action, StartCall)
    return session.call_started(
        record(call_id, job_id=job_id, request_id=request_id, progress_token=progress_token)
    )


def replayed(session: Session) -> list[Action]:
    """Every held event that may go now, handled in order (as the shell does)."""
    actions: list[Action] = []
    while (held := session.replay()) is not None:
        actions += held
    return actions


def succeeded(call_id: str) -> dict[str, Any]:
    return responses.succeeded(call_id, {"html": "<p>x</p>"}, 12)


def assert_error(payload: dict[str, Any], code: str, *, retryable: bool = False) -> dict[str, Any]:
    error: dict[str, Any] = payload["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["retryable"] is retryable
    return error


# -- the connection ------------------------------------------------------------------------


def test_a_new_session_drops_frames_until_its_credential_is_accepted() -> None:
    session = new_session()
    assert session.state is ConnectionState.CONNECTING
    assert session.receive(Initialize(id="i")) == []
    assert session.receive(refusal("{oops")) == []


@pytest.mark.parametrize(
    ("reason", "code", "retryable"),
    [
        ("missing-credentials", 4401, False),
        ("invalid-credentials", 4401, False),
        ("key-revoked", 4403, False),
        ("expired-credentials", 4419, True),
    ],
)
def test_a_refused_credential_is_named_then_closed(reason: str, code: int, retryable: bool) -> None:
    session = new_session()
    actions = session.refuse(reason)
    assert actions[1:] == [Close(code=code)]
    note = envelope(actions[0])
    assert note["type"] == "notification"
    assert note["payload"]["event"] == "notifications/error"
    data = note["payload"]["data"]
    assert data["code"] == "PERMISSION_DENIED"
    assert data["retryable"] is retryable
    assert data["details"] == {"reason": reason, "closeCode": code}
    assert session.state is ConnectionState.REFUSED
    # Later frames are dropped; the socket is closing.
    assert session.receive(Initialize(id="i")) == []
    assert session.receive(call("c")) == []
    assert session.disconnected(code) == [StopTimers()]
    assert state_of(session) is ConnectionState.CLOSED


# -- initialize --------------------------------------------------------------------------


def test_initialize_opens_the_session() -> None:
    session = connected()
    message = Initialize(
        id="init-7",
        agent=AgentInfo(name="agent", version="2"),
        features=Features(notifications=True, progress=False, elicitation=True),
    )
    [action] = session.receive(message)
    assert action == OpenSession(session_id="id-1", message=message, resume_token="token-1")
    assert session.state is ConnectionState.NEW  # until the shell reports it recorded
    reply = sent(session.opened(action))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "init-7"
    assert reply["payload"] == {
        "sessionId": "id-1",
        "protocolVersion": "0.1",
        "app": APP,
        "capabilities": [{"name": name, "available": True} for name in NAMES],
        # We elicit nothing yet, so elicitation is never echoed as on.
        "features": {"notifications": True, "progress": False, "elicitation": False},
        "resumeToken": "token-1",
    }
    assert state_of(session) is ConnectionState.OPEN
    assert session.session_id == "id-1"
    assert session.notifications is True


def test_initialize_echoes_the_features_asked_for() -> None:
    session = connected()
    [action] = session.receive(Initialize(id="i", features=Features(progress=True)))
    assert isinstance(action, OpenSession)
    assert sent(session.opened(action))["payload"]["features"] == {
        "notifications": False,
        "progress": True,
        "elicitation": False,
    }
    assert session.notifications is False


def test_capability_names_are_read_when_the_session_opens() -> None:
    names: list[str] = []
    session = Session(capability_names=lambda: list(names), app={}, new_id=counter())
    session.accepted(Limits())
    names.append("late.one")
    [action] = session.receive(Initialize(id="i"))
    assert isinstance(action, OpenSession)
    capabilities = sent(session.opened(action))["payload"]["capabilities"]
    assert capabilities == [{"name": "late.one", "available": True}]


def test_the_session_shows_the_agent_only_what_it_may_call_in_both_lists() -> None:
    """`shown` filters `initialize-result` and `capabilities/list` alike (the shell
    passes what the principal may call: access/visibility.py)."""
    entries: list[dict[str, Any]] = [
        {"name": name, "inputSchema": {}} for name in ("a.one", "b.two")
    ]
    session = Session(
        capability_names=lambda: ["a.one", "b.two"],
        app={},
        new_id=counter(),
        describe=lambda: entries,
        shown=lambda name: name != "b.two",
    )
    session.accepted(Limits())
    [action] = session.receive(Initialize(id="i"))
    assert isinstance(action, OpenSession)
    listed = sent(session.opened(action))["payload"]["capabilities"]
    assert listed == [{"name": "a.one", "available": True}]
    described = sent(session.receive(ListCapabilities(id="l")))["payload"]["capabilities"]
    assert described == [{"name": "a.one", "inputSchema": {}}]


def test_second_initialize_is_already_initialized() -> None:
    session = open_session()
    reply = sent(session.receive(Initialize(id="again")))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "again"
    assert set(reply["payload"]) == {"error"}
    assert_error(reply["payload"], "ALREADY_INITIALIZED")
    assert session.state is ConnectionState.OPEN
    assert session.session_id == "id-1"


def test_initialize_while_the_first_is_being_recorded_is_already_initialized() -> None:
    session = connected()
    [action] = session.receive(Initialize(id="first"))
    assert isinstance(action, OpenSession)
    reply = sent(session.receive(Initialize(id="second")))
    assert reply["id"] == "second"
    assert_error(reply["payload"], "ALREADY_INITIALIZED")
    assert sent(session.opened(action))["id"] == "first"


def test_initialize_over_the_open_sessions_budget_is_refused_and_closed() -> None:
    session = connected()
    [action] = session.receive(Initialize(id="i"))
    assert isinstance(action, OpenSession)
    error = WireError(code=ErrorCode.RATE_LIMITED, message="Too many sessions.")
    actions = session.open_refused(error)
    assert actions[1:] == [Close(code=4429)]
    reply = envelope(actions[0])
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "i"
    assert_error(reply["payload"], "RATE_LIMITED", retryable=True)
    assert session.state is ConnectionState.REFUSED
    assert session.receive(call("c")) == []


def test_initialize_with_resume_is_session_invalid_when_resuming_is_off() -> None:
    session = connected()
    resume = ResumeRequest(session_id="old", token="tok")
    reply = sent(session.receive(Initialize(id="r", resume=resume)))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "r"
    assert set(reply["payload"]) == {"error"}
    assert_error(reply["payload"], "SESSION_INVALID")
    assert session.state is ConnectionState.NEW
    assert session.session_id is None
    # The connection can still start a fresh session.
    assert isinstance(session.receive(Initialize(id="i"))[0], OpenSession)


# -- before initialize ---------------------------------------------------------------------


def test_call_before_initialize() -> None:
    session = connected()
    reply = sent(session.receive(call("c-1", message_id="early")))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "early"
    assert reply["payload"]["success"] is False
    assert reply["payload"]["metadata"] == {"duration": 0}
    assert_error(reply["payload"], "NOT_INITIALIZED")
    assert session.state is ConnectionState.NEW


def test_cancel_before_initialize() -> None:
    reply = sent(connected().receive(CancelRequest(id="k", call_id="c-1")))
    assert reply["type"] == "capabilities/cancel-result"
    assert reply["id"] == "k"
    assert set(reply["payload"]) == {"error"}
    assert_error(reply["payload"], "NOT_INITIALIZED")


@pytest.mark.parametrize(
    ("message", "request_type"),
    [
        (Shutdown(id="s"), "shutdown"),
        (ElicitationResponse(id="s", payload={"action": "accept"}), "elicitation/response"),
    ],
)
def test_messages_without_a_reply_type_before_initialize(
    message: Message, request_type: str
) -> None:
    session = connected()
    reply = sent(session.receive(message))
    assert reply["type"] == "notification"
    assert reply["id"] != "s"
    assert reply["payload"]["event"] == "notifications/error"
    data = reply["payload"]["data"]
    assert data["code"] == "NOT_INITIALIZED"
    assert data["requestId"] == "s"
    assert data["requestType"] == request_type
    assert session.state is ConnectionState.NEW


def test_protocol_error_of_a_call_before_initialize_is_not_initialized() -> None:
    error = refusal(frame("capabilities/call", {"params": {}}, "early"))
    reply = sent(connected().receive(error))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "early"
    assert reply["payload"]["success"] is False
    assert_error(reply["payload"], "NOT_INITIALIZED")


def test_protocol_error_of_an_initialize_keeps_its_code() -> None:
    session = connected()
    error = refusal(frame("initialize", {"features": []}, "i-1"))
    reply = sent(session.receive(error))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "i-1"
    assert assert_error(reply["payload"], "INVALID_TYPE")["details"] == {"path": "payload.features"}
    assert session.state is ConnectionState.NEW


def test_unparsable_frame_before_initialize_is_a_parse_error_notification() -> None:
    reply = sent(connected().receive(refusal("{oops")))
    assert reply["type"] == "notification"
    assert reply["payload"]["event"] == "notifications/error"
    assert reply["payload"]["data"]["code"] == "PARSE_ERROR"
    assert "requestId" not in reply["payload"]["data"]


# -- protocol errors once open --------------------------------------------------------------


def test_protocol_error_of_a_call_is_answered_in_a_call_result() -> None:
    session = open_session()
    error = refusal(frame("capabilities/call", {"capability": "export.pdf", "params": 3}, "q"))
    reply = sent(session.receive(error))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "q"
    assert reply["payload"]["success"] is False
    assert "callId" not in reply["payload"]
    assert assert_error(reply["payload"], "INVALID_TYPE")["details"] == {"path": "payload.params"}
    assert session.state is ConnectionState.OPEN


def test_protocol_error_of_a_cancel_is_answered_in_a_cancel_result() -> None:
    reply = sent(open_session().receive(refusal(frame("capabilities/cancel", {}, "k"))))
    assert reply["type"] == "capabilities/cancel-result"
    assert reply["id"] == "k"
    assert_error(reply["payload"], "MISSING_PARAM")


@pytest.mark.parametrize(
    ("text", "code", "request_id", "request_type"),
    [
        (frame("shutdown", {"reason": 5}, "s-1"), "INVALID_TYPE", "s-1", "shutdown"),
        (frame("ping", {}, "p-1"), "UNKNOWN_MESSAGE_TYPE", "p-1", "ping"),
        ("[1, 2]", "PARSE_ERROR", None, None),
        (
            json.dumps({"type": "capabilities/call", "payload": {}}),
            "PARSE_ERROR",
            None,
            "capabilities/call",
        ),
    ],
)
def test_protocol_error_without_a_reply_is_a_notification(
    text: str, code: str, request_id: str | None, request_type: str | None
) -> None:
    session = open_session()
    reply = sent(session.receive(refusal(text)))
    assert reply["type"] == "notification"
    assert reply["payload"]["event"] == "notifications/error"
    data = reply["payload"]["data"]
    assert data["code"] == code
    assert data.get("requestId") == request_id
    assert data.get("requestType") == request_type
    assert session.state is ConnectionState.OPEN


def test_elicitation_response_when_open_is_refused_with_a_notification() -> None:
    reply = sent(open_session().receive(ElicitationResponse(id="e-1")))
    assert reply["type"] == "notification"
    assert reply["payload"]["event"] == "notifications/error"
    assert reply["payload"]["data"]["code"] == "INVALID_PARAMS"
    assert reply["payload"]["data"]["requestId"] == "e-1"


# -- calls ----------------------------------------------------------------------------------


def test_call_starts_with_everything_the_agent_sent() -> None:
    session = open_session()
    message = CallRequest(
        id="req-9",
        capability="process.image",
        params={"image": {"content": "AA=="}, "operations": []},
        options=CallOptions(call_id="c-9", timeout_ms=5000, progress_token=42),
    )
    assert session.receive(message) == [
        StartCall(
            request_id="req-9",
            stored_request_id="req-9",
            call_id="c-9",
            capability="process.image",
            params={"image": {"content": "AA=="}, "operations": []},
            params_hash=call_digest(
                "process.image", {"image": {"content": "AA=="}, "operations": []}
            ),
            timeout_ms=5000,
            progress_token=42,
            notify_started=False,
        )
    ]
    # Not in flight until the shell reports the job exists.
    assert session.in_flight("c-9") is None


def test_a_call_asks_for_the_started_note_when_notifications_are_on() -> None:
    [action] = open_session(NOTIFICATIONS).receive(call("c-1"))
    assert isinstance(action, StartCall)
    assert action.notify_started is True


def test_call_without_call_id_gets_a_generated_one() -> None:
    session = open_session()  # id-1 went to the session id
    [action] = session.receive(call(None))
    assert isinstance(action, StartCall)
    assert action.call_id == "id-2"
    assert action.timeout_ms is None
    assert action.progress_token is None
    [action] = session.receive(call(None))
    assert isinstance(action, StartCall)
    assert action.call_id == "id-3"


def test_a_started_call_is_in_flight_with_a_timer_for_what_is_left_of_its_deadline() -> None:
    clock = Clock()
    session = open_session(clock=clock)
    [action] = session.receive(call("c-1", message_id="req-3", progress_token="tok"))
    assert isinstance(action, StartCall)
    started = record("c-1", job_id="job-3", request_id="req-3", progress_token="tok")
    assert session.call_started(replace(started, seconds_left=4.5)) == [
        StartTimer(call_id="c-1", seconds=4.5)
    ]
    held = session.in_flight("c-1")
    assert held is not None
    assert (held.call_id, held.request_id, held.job_id) == ("c-1", "req-3", "job-3")
    assert (held.progress_token, held.started, held.own) == ("tok", 100.0, True)
    # A deadline already past times out at once.
    session.receive(call("c-2"))
    assert session.call_started(replace(started, call_id="c-2", seconds_left=-3.0)) == [
        StartTimer(call_id="c-2", seconds=0.0)
    ]


def test_a_call_the_service_refuses_is_answered_with_its_error() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    error = WireError(code=ErrorCode.INVALID_PARAMS, message="html is required.")
    reply = sent(session.call_refused(action, error))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "r-1"
    assert reply["payload"]["callId"] == "c-1"
    assert reply["payload"]["metadata"] == {"duration": 0}
    assert_error(reply["payload"], "INVALID_PARAMS")
    assert session.in_flight("c-1") is None


def test_call_of_an_unknown_capability() -> None:
    session = open_session()
    reply = sent(session.receive(call("c-1", message_id="u", capability="export.docx")))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "u"
    assert reply["payload"]["callId"] == "c-1"
    assert reply["payload"]["success"] is False
    assert reply["payload"]["metadata"] == {"duration": 0}
    error = assert_error(reply["payload"], "UNKNOWN_CAPABILITY")
    assert error["details"] == {"capability": "export.docx"}
    assert session.in_flight("c-1") is None


def test_call_of_an_unknown_capability_without_call_id_carries_the_generated_one() -> None:
    reply = sent(open_session().receive(call(None, capability="nope")))
    assert reply["payload"]["callId"] == "id-2"


def test_call_id_already_in_flight_is_invalid_params() -> None:
    session = open_session()
    start(session, "c-1")
    reply = sent(session.receive(call("c-1", message_id="dup")))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "dup"
    assert reply["payload"]["success"] is False
    error = assert_error(reply["payload"], "INVALID_PARAMS")
    assert error["details"] == {"path": "payload.options.callId"}
    # The running call is untouched.
    assert session.in_flight("c-1") is not None


def test_an_answered_call_id_goes_to_the_call_service_again() -> None:
    # The session only knows the calls it holds; the service refuses a reused id.
    session = open_session()
    start(session, "c-1")
    [claim] = session.job_settled("c-1", succeeded("c-1"))
    assert isinstance(claim, ClaimResult)
    session.result_claimed(claim, succeeded("c-1"))
    [action] = session.receive(call("c-1", message_id="again"))
    assert isinstance(action, StartCall)
    assert action.call_id == "c-1"
    used = WireError(code=ErrorCode.INVALID_PARAMS, message="callId 'c-1' was already used.")
    assert sent(session.call_refused(action, used))["id"] == "again"


# -- limits ----------------------------------------------------------------------------------


def test_calls_beyond_the_concurrency_limit_are_rate_limited() -> None:
    session = open_session(limits=Limits(max_queued_calls=2))
    for n in (1, 2):
        start(session, f"c{n}", job_id=f"j{n}", request_id=f"r{n}")
    error = sent(session.receive(call("c3", message_id="r3")))["payload"]["error"]
    assert error["code"] == "RATE_LIMITED"
    assert error["retryable"] is True
    assert error["details"] == {"limit": "queuedCalls", "max": 2}
    [claim] = session.job_settled("c1", None)
    assert isinstance(claim, ClaimResult)
    session.result_claimed(claim, succeeded("c1"))
    assert isinstance(session.receive(call("c3", message_id="r4"))[0], StartCall)


def test_a_timeout_over_the_maximum_is_invalid_params() -> None:
    session = open_session(limits=Limits(max_timeout_ms=lambda _name: 1000))
    assert isinstance(session.receive(call("ok", timeout_ms=1000))[0], StartCall)
    error = sent(session.receive(call("long", timeout_ms=1001)))["payload"]["error"]
    assert error["code"] == "INVALID_PARAMS"
    assert error["details"] == {"path": "payload.options.timeout", "max": 1000}


def test_the_timeout_maximum_is_the_capability_s_own() -> None:
    maxima = {NAMES[0]: 1000, NAMES[1]: 5000}
    session = open_session(limits=Limits(max_timeout_ms=maxima.__getitem__))
    [action] = session.receive(call("slow", capability=NAMES[1], timeout_ms=5000))
    assert isinstance(action, StartCall)
    error = sent(session.receive(call("fast", capability=NAMES[0], timeout_ms=5000)))
    assert error["payload"]["error"]["details"]["max"] == 1000


# -- results ----------------------------------------------------------------------------------


def test_a_settled_call_is_claimed_then_sent_once() -> None:
    session = open_session()
    start(session, "c-1", job_id="j-1", request_id="r-1")
    response = succeeded("c-1")
    [claim] = session.job_settled("c-1", response)
    assert claim == ClaimResult(call_id="c-1", job_id="j-1", response=response)
    actions = session.result_claimed(claim, response)
    assert actions[0] == StopTimer(call_id="c-1")
    assert isinstance(actions[1], Send)
    assert actions[1].claims == "j-1"
    reply = envelope(actions[1])
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "r-1"
    assert reply["payload"] == response
    assert len(actions) == 2
    assert session.in_flight("c-1") is None
    # A second claim's answer, or a late note, sends nothing.
    assert session.result_claimed(claim, response) == []
    assert session.job_settled("c-1", response) == [
        LookUp(call_id="c-1", then=DeliverFound(response=response))
    ]


def test_with_notifications_a_result_is_announced_completed_first() -> None:
    session = open_session(NOTIFICATIONS)
    start(session, "c-1")
    [claim] = session.job_settled("c-1", None)
    assert isinstance(claim, ClaimResult)
    actions = session.result_claimed(claim, succeeded("c-1"))
    assert actions[0] == StopTimer(call_id="c-1")
    note = envelope(actions[1])
    assert note["type"] == "notification"
    assert note["payload"] == {
        "event": "notifications/operation/completed",
        "data": {"operationId": "c-1"},
    }
    assert envelope(actions[2])["type"] == "capabilities/call-result"


def test_a_claim_of_a_job_still_active_leaves_the_call_in_flight() -> None:
    session = open_session()
    start(session, "c-1")
    [claim] = session.job_settled("c-1", None)
    assert isinstance(claim, ClaimResult)
    assert session.result_claimed(claim, STILL_ACTIVE) == []
    assert session.in_flight("c-1") is not None


def test_a_result_claimed_elsewhere_is_not_sent_here() -> None:
    session = open_session()
    start(session, "c-1")
    [claim] = session.job_settled("c-1", None)
    assert isinstance(claim, ClaimResult)
    assert session.result_claimed(claim, DELIVERED_ELSEWHERE) == [StopTimer(call_id="c-1")]
    assert session.in_flight("c-1") is None


def test_a_settled_call_not_held_here_is_looked_up_adopted_and_delivered() -> None:
    session = open_session()
    response = succeeded("other")
    [look_up] = session.job_settled("other", response)
    assert look_up == LookUp(call_id="other", then=DeliverFound(response=response))
    found = record("other", job_id="j-9", status="succeeded")
    assert session.found(look_up, found) == [
        ClaimResult(call_id="other", job_id="j-9", response=response)
    ]
    assert session.in_flight("other") is not None
    # Nothing to deliver: unknown, or answered already.
    assert session.found(look_up, None) == []
    assert session.found(look_up, replace(found, call_id="x", delivered=True)) == []


def test_a_returned_result_is_looked_up_by_its_job() -> None:
    session = open_session()
    [look_up] = session.job_returned("j-4")
    assert look_up == LookUp(job_id="j-4", then=DeliverFound())
    assert session.found(look_up, record("c-4", job_id="j-4", status="failed")) == [
        ClaimResult(call_id="c-4", job_id="j-4", response=None)
    ]


def test_a_result_whose_send_was_dropped_is_given_back() -> None:
    session = open_session()
    assert session.send_dropped("j-1") == [GiveBack(job_id="j-1")]
    assert session.state is ConnectionState.GONE
    assert session.send_dropped(None) == []


def test_once_the_socket_is_gone_results_are_left_for_a_resume() -> None:
    session = open_session()
    start(session, "c-1")
    session.socket_gone()
    assert session.state is ConnectionState.GONE
    assert session.job_settled("c-1", None) == []
    assert session.job_settled("elsewhere", None) == []
    assert session.job_returned("j-2") == []
    # Frames that came in before the drop are still handled.
    assert isinstance(session.receive(call("c-2"))[0], StartCall)


def test_started_and_progress_notes() -> None:
    session = open_session(NOTIFICATIONS)
    start(session, "c-1", progress_token="p-1")
    started = sent(session.job_started("c-1"))
    assert started["payload"] == {
        "event": "notifications/operation/started",
        "data": {"operationId": "c-1"},
    }
    progress = sent(session.job_progress("c-1", progress=1, total=4, stage="page 1"))
    assert progress["type"] == "progress"
    assert progress["payload"]["operationId"] == "p-1"
    assert progress["payload"]["percentage"] == 25.0
    assert progress["payload"]["stage"] == "page 1"
    # Not for calls not held here.
    assert session.job_started("other") == []
    assert session.job_progress("other", progress=1, total=None, stage="") == []


def test_no_started_note_without_notifications_nor_progress_without_a_token() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.job_started("c-1") == []
    assert session.job_progress("c-1", progress=1, total=2, stage="x") == []


# -- cancel ---------------------------------------------------------------------------------


def agent_cancel(call_id: str, request_id: str, job_id: str, reason: str = "") -> SettleCancels:
    return SettleCancels(
        call_ids=(call_id,),
        job_ids=(job_id,),
        source="agent",
        reason=reason,
        delivered=True,
        request_id=request_id,
        read_losers=True,
    )


def test_cancel_of_a_call_in_flight_settles_it_first() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.receive(CancelRequest(id="k-1", call_id="c-1", reason="stop")) == [
        agent_cancel("c-1", "k-1", "job-1", "stop")
    ]
    # The session only asks; the call is answered once the settle's outcome is known.
    assert session.in_flight("c-1") is not None


def test_a_won_cancel_answers_the_cancel_then_the_call_then_stops_the_work() -> None:
    clock = Clock()
    session = open_session(NOTIFICATIONS, clock=clock)
    start(session, "c-1", request_id="r-1")
    [settle] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(settle, SettleCancels)
    clock.now += 1.5
    actions = session.cancels_settled(settle, {"job-1": True})
    cancel_reply = envelope(actions[0])
    assert cancel_reply["type"] == "capabilities/cancel-result"
    assert cancel_reply["id"] == "k-1"
    assert cancel_reply["payload"] == {"callId": "c-1", "cancelled": True}
    assert actions[1] == StopTimer(call_id="c-1")
    assert envelope(actions[2])["payload"]["event"] == "notifications/operation/completed"
    result = envelope(actions[3])
    assert isinstance(actions[3], Send)
    assert actions[3].claims == "job-1"
    assert result["type"] == "capabilities/call-result"
    assert result["id"] == "r-1"
    assert result["payload"] == responses.cancelled("c-1", "agent", 1500)
    assert actions[4:] == [StopWork(job_id="job-1")]
    assert session.in_flight("c-1") is None


def test_a_cancel_overtaking_its_call_asks_to_cancel_the_start() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    message = CancelRequest(id="k-1", call_id="c-1", reason="stop")
    assert session.receive(message) == [CancelStart(call_id="c-1", reason="stop", message=message)]


def test_a_start_cancelled_in_time_is_answered_once_its_cancelled_row_is_written() -> None:
    session = open_session(NOTIFICATIONS)
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    [cancel] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(cancel, CancelStart)
    # Won: nothing is said until the row is written (settled cancelled, delivered).
    assert session.start_ticket(cancel, won=True) == []
    assert session.receive(CancelRequest(id="k-2", call_id="c-1")) == []  # held
    actions = session.call_started(record("c-1", request_id="r-1", status="cancelled"))
    assert [envelope(a)["type"] for a in actions] == [
        "capabilities/cancel-result",
        "notification",
        "capabilities/call-result",
    ]
    assert envelope(actions[0])["payload"] == {"callId": "c-1", "cancelled": True}
    assert envelope(actions[2])["id"] == "r-1"
    assert envelope(actions[2])["payload"] == responses.cancelled("c-1", "agent", 0)
    assert session.in_flight("c-1") is None
    # The second cancel goes now, and finds the call in the database.
    [look_up] = session.replay() or []
    assert look_up == LookUp(call_id="c-1", then=CancelFound(request_id="k-2", reason=""))
    assert session.replay() is None


def test_a_start_cancelled_in_time_but_refused_says_so_to_both() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    [cancel] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(cancel, CancelStart)
    session.start_ticket(cancel, won=True)
    refused = WireError(code=ErrorCode.INVALID_PARAMS, message="html is required.")
    result, reply = session.call_refused(action, refused)
    assert_error(envelope(result)["payload"], "INVALID_PARAMS")
    assert envelope(reply)["payload"] == {
        "callId": "c-1", "cancelled": False, "reason": replies.ALREADY_COMPLETED,
    }  # fmt: skip
    assert session.call_started(record("c-1", request_id="r-1")) == []  # over


def test_a_cancel_that_lost_the_start_waits_for_the_row_then_settles() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    message = CancelRequest(id="k-1", call_id="c-1")
    [cancel] = session.receive(message)
    assert isinstance(cancel, CancelStart)
    assert session.start_ticket(cancel, won=False) == []
    # Everything about the call waits for its row, and frames stay behind the cancel.
    assert session.job_started("c-1") == []
    assert session.receive(call("c-2", message_id="r-2")) == []
    assert session.replay() is None
    assert session.call_started(record("c-1", request_id="r-1")) == [
        StartTimer(call_id="c-1", seconds=30.0)
    ]
    settle, start_c2 = replayed(session)  # the note says nothing: no notifications asked
    assert isinstance(settle, SettleCancels)
    assert settle.request_id == "k-1"
    assert isinstance(start_c2, StartCall)
    assert start_c2.call_id == "c-2"


def test_a_cancel_that_won_a_copy_of_a_call_another_copy_wrote_cancels_that_call() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1", resent=True))
    assert isinstance(action, StartCall)
    [cancel] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(cancel, CancelStart)
    session.start_ticket(cancel, won=True)
    written = record("c-1", job_id="job-7", request_id="r-0")  # by the old connection
    assert session.call_adopted(action, written) == [StartTimer(call_id="c-1", seconds=30.0)]
    [settle] = session.replay() or []
    assert isinstance(settle, SettleCancels)
    assert settle.job_ids == ("job-7",)
    assert settle.request_id == "k-1"


def test_a_cancel_that_won_a_reused_call_id_cancels_the_call_that_holds_it() -> None:
    session = open_session()
    [action] = session.receive(call("c-1", message_id="r-1"))
    assert isinstance(action, StartCall)
    [cancel] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(cancel, CancelStart)
    session.start_ticket(cancel, won=True)
    reply = sent(session.call_adopted(action, record("c-1", job_id="job-7", request_id="r-0")))
    assert_error(reply["payload"], "INVALID_PARAMS")  # not resent: a reused callId
    [look_up] = replayed(session)  # the cancel names the call that holds the callId
    assert look_up == LookUp(call_id="c-1", then=CancelFound(request_id="k-1", reason=""))


def test_a_call_being_started_holds_its_call_id_and_its_place_in_the_queue() -> None:
    session = open_session(limits=Limits(max_queued_calls=1))
    [action] = session.receive(call("c-1"))
    assert isinstance(action, StartCall)
    # The same callId waits for the start, and the next call behind it.
    assert session.receive(call("c-1", message_id="r-2")) == []
    assert session.receive(call("c-2", message_id="r-3")) == []
    # Refused by the call service: the held call goes, and takes the only place.
    session.call_refused(action, WireError(code=ErrorCode.INVALID_PARAMS, message="no"))
    again, other = replayed(session)
    assert isinstance(again, StartCall)
    assert again.request_id == "r-2"
    assert_error(envelope(other)["payload"], "RATE_LIMITED", retryable=True)


def test_a_lost_cancel_says_what_the_call_ended_as_and_delivers_it() -> None:
    session = open_session()
    start(session, "c-1", request_id="r-1")
    [settle] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(settle, SettleCancels)
    response = succeeded("c-1")
    actions = session.cancels_settled(settle, {"job-1": False}, {"job-1": response})
    cancel_reply = envelope(actions[0])
    assert cancel_reply["payload"] == {
        "callId": "c-1",
        "cancelled": False,
        "reason": replies.ALREADY_COMPLETED,
    }
    assert actions[1:] == [ClaimResult(call_id="c-1", job_id="job-1", response=response)]
    [stop, result] = session.result_claimed(
        ClaimResult(call_id="c-1", job_id="job-1", response=response), response
    )
    assert stop == StopTimer(call_id="c-1")
    assert envelope(result)["payload"] == response


def test_a_cancel_lost_to_another_cancel_says_cancelled() -> None:
    session = open_session()
    start(session, "c-1")
    [settle] = session.receive(CancelRequest(id="k-1", call_id="c-1"))
    assert isinstance(settle, SettleCancels)
    timed_out = responses.cancelled("c-1", "timeout", 30000)
    actions = session.cancels_settled(settle, {"job-1": False}, {"job-1": timed_out})
    assert envelope(actions[0])["payload"] == {"callId": "c-1", "cancelled": True}
    assert isinstance(actions[1], ClaimResult)


def test_cancel_of_an_unknown_call_is_looked_up_and_not_found() -> None:
    session = open_session()
    [look_up] = session.receive(CancelRequest(id="k-2", call_id="ghost"))
    assert look_up == LookUp(call_id="ghost", then=CancelFound(request_id="k-2", reason=""))
    reply = sent(session.found(look_up, None))
    assert reply["type"] == "capabilities/cancel-result"
    assert reply["id"] == "k-2"
    assert reply["payload"] == {
        "callId": "ghost",
        "cancelled": False,
        "reason": "Operation not found",
    }


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        ("succeeded", {"cancelled": False, "reason": replies.ALREADY_COMPLETED}),
        ("failed", {"cancelled": False, "reason": replies.ALREADY_COMPLETED}),
        ("cancelled", {"cancelled": True}),
    ],
)
def test_cancel_of_an_answered_call_says_how_it_ended(status: str, payload: dict[str, Any]) -> None:
    session = open_session()
    start(session, "c-1")
    [claim] = session.job_settled("c-1", None)
    assert isinstance(claim, ClaimResult)
    session.result_claimed(claim, succeeded("c-1"))
    [look_up] = session.receive(CancelRequest(id="k", call_id="c-1"))
    assert isinstance(look_up, LookUp)
    answered = record("c-1", status=status, delivered=True)
    assert sent(session.found(look_up, answered))["payload"] == {"callId": "c-1", **payload}


def test_cancel_of_a_call_another_connection_made_adopts_it_then_settles() -> None:
    session = open_session()
    [look_up] = session.receive(CancelRequest(id="k", call_id="theirs", reason="r"))
    assert isinstance(look_up, LookUp)
    found = record("theirs", job_id="j-7", seconds_left=2.0)
    assert session.found(look_up, found) == [
        StartTimer(call_id="theirs", seconds=2.0),
        agent_cancel("theirs", "k", "j-7", "r"),
    ]
    assert session.in_flight("theirs") is not None


# -- timeouts ---------------------------------------------------------------------------------


def test_a_timeout_settles_the_call_and_answers_it_with_timeout() -> None:
    session = open_session()
    start(session, "c-1", request_id="r-1")
    [settle] = session.timed_out("c-1")
    assert settle == SettleCancels(
        call_ids=("c-1",),
        job_ids=("job-1",),
        source="timeout",
        reason="options.timeout",
        delivered=True,
    )
    actions = session.cancels_settled(settle, {"job-1": True})
    assert actions[0] == StopTimer(call_id="c-1")
    result = envelope(actions[1])
    assert result["id"] == "r-1"
    assert result["payload"]["cancelled"] is True
    assert_error(result["payload"], "TIMEOUT", retryable=True)
    assert actions[2:] == [StopWork(job_id="job-1")]
    assert session.timed_out("c-1") == []


def test_a_timeout_lost_to_the_worker_delivers_the_worker_s_result() -> None:
    session = open_session()
    start(session, "c-1")
    [settle] = session.timed_out("c-1")
    assert isinstance(settle, SettleCancels)
    assert session.cancels_settled(settle, {"job-1": False}) == [
        ClaimResult(call_id="c-1", job_id="job-1", response=None)
    ]


def test_a_timer_of_a_call_not_held_does_nothing() -> None:
    assert open_session().timed_out("never") == []


# -- shutdown ------------------------------------------------------------------------------------


def test_shutdown_ends_the_session_answers_every_call_then_closes() -> None:
    session = open_session()
    start(session, "c-1")
    then = EndAll(source="shutdown", reason="bye")
    assert session.receive(Shutdown(id="s", reason="bye")) == [
        EndSession(session_id="id-1", reason="shutdown: bye"),
        FindUnanswered(then=then),
        Close(code=1000),
    ]
    assert session.state is ConnectionState.ENDING
    # Its own call, and one another connection of the session made a moment ago.
    theirs = record("c-2", job_id="job-2", request_id="r-2")
    [settle] = session.unanswered(then, [record("c-1"), theirs])
    assert settle == SettleCancels(
        call_ids=("c-1", "c-2"),
        job_ids=("job-1", "job-2"),
        source="shutdown",
        reason="bye",
        delivered=True,
    )
    actions = session.cancels_settled(settle, {"job-1": True, "job-2": False})
    assert actions[0] == StopTimer(call_id="c-1")
    result = envelope(actions[1])
    assert result["id"] == "req-1"
    assert assert_error(result["payload"], "CANCELLED")
    assert actions[2:] == [
        StopWork(job_id="job-1"),
        ClaimResult(call_id="c-2", job_id="job-2", response=None),
    ]
    # The shell performs the close last.
    assert session.socket_gone() == []
    assert state_of(session) is ConnectionState.CLOSED


def test_shutdown_without_reason() -> None:
    actions = open_session().receive(Shutdown(id="s"))
    assert actions[:2] == [
        EndSession(session_id="id-1", reason="shutdown: shutdown"),
        FindUnanswered(then=EndAll(source="shutdown", reason="shutdown")),
    ]


def test_shutdown_with_nothing_unanswered_settles_nothing() -> None:
    session = open_session()
    [_, find, _] = session.receive(Shutdown(id="s"))
    assert isinstance(find, FindUnanswered)
    assert session.unanswered(find.then, []) == []


AFTER_SHUTDOWN = [
    Initialize(id="i2"),
    call("c-2"),
    CancelRequest(id="k", call_id="c-1"),
    Shutdown(id="s2"),
    ElicitationResponse(id="e"),
]


@pytest.mark.parametrize("message", AFTER_SHUTDOWN)
def test_messages_while_shutting_down_are_ignored(message: Message) -> None:
    session = open_session()
    session.receive(Shutdown(id="s"))
    assert session.state is ConnectionState.ENDING
    assert session.receive(message) == []


@pytest.mark.parametrize("message", AFTER_SHUTDOWN)
def test_messages_after_shutdown_are_ignored(message: Message) -> None:
    session = open_session()
    session.receive(Shutdown(id="s"))
    session.socket_gone()
    assert session.receive(message) == []
    assert session.disconnected(1000) == [StopTimers()]
    assert session.state is ConnectionState.CLOSED


@pytest.mark.parametrize(
    "text",
    ["{oops", frame("capabilities/call", {}, "late"), frame("capabilities/cancel", {}, "late")],
)
def test_undecodable_frames_after_shutdown_are_ignored(text: str) -> None:
    session = open_session()
    session.receive(Shutdown(id="s"))
    assert session.receive(refusal(text)) == []
    session.socket_gone()
    assert session.receive(refusal(text)) == []


# -- disconnect ------------------------------------------------------------------------------------


def test_a_disconnect_that_cannot_be_resumed_cancels_the_calls_then_ends_the_session() -> None:
    session = open_session()
    start(session, "c-1")
    session.socket_gone()
    settle, *rest = session.disconnected(1006)
    assert settle == SettleCancels(
        call_ids=("c-1",),
        job_ids=("job-1",),
        source="disconnect",
        reason="connection closed",
        delivered=False,
    )
    assert rest == [StopTimers(), EndSession(session_id="id-1", reason="disconnected (1006)")]
    assert session.state is ConnectionState.CLOSED
    # Nobody to tell: the work is stopped, nothing is sent.
    assert session.cancels_settled(settle, {"job-1": True}) == [
        StopTimer(call_id="c-1"),
        StopWork(job_id="job-1"),
    ]
    assert session.receive(call("c-2")) == []
    assert session.disconnected(1006) == [StopTimers()]


def test_a_disconnect_without_calls_just_ends_the_session() -> None:
    session = open_session()
    assert session.disconnected(1001) == [
        StopTimers(),
        EndSession(session_id="id-1", reason="disconnected (1001)"),
    ]


def test_a_resumable_session_detaches_instead_of_cancelling() -> None:
    session = open_session(limits=Limits(resumable=True))
    start(session, "c1")
    assert session.disconnected(1006) == [StopTimers(), Detach(session_id="id-1", generation=0)]
    assert session.in_flight("c1") is None  # the resuming connection answers it
    assert session.state is ConnectionState.DETACHED
    assert session.receive(call("c-2")) == []
    assert session.job_settled("c1", None) == []
    assert session.superseded(5) == []


def test_disconnect_before_initialize_does_nothing() -> None:
    session = connected()
    assert session.disconnected(1000) == [StopTimers()]
    assert session.state is ConnectionState.CLOSED
    assert session.receive(Initialize(id="i")) == []


def test_undecodable_frames_after_disconnect_are_ignored() -> None:
    session = open_session()
    session.disconnected(1000)
    assert session.receive(refusal("{oops")) == []


# -- resuming ---------------------------------------------------------------------------


def resuming(token: str = "tok") -> tuple[Session, ResumeSession]:
    session = connected(limits=Limits(resumable=True))
    [action] = session.receive(
        Initialize(id="r", resume=ResumeRequest(session_id="s-9", token=token))
    )
    assert action == ResumeSession(session_id="s-9", token=token)
    assert session.state is ConnectionState.NEW  # until the shell reports back
    return session, action


def test_a_resumed_session_times_its_running_calls_and_delivers_its_settled_ones() -> None:
    session, action = resuming()
    running = record("c1", job_id="j1", request_id="q1", seconds_left=7.0)
    done = record("c2", job_id="j2", request_id="q2", status="succeeded")
    actions = session.resumed(
        action, token="token-new", generation=3, was_held=False, calls=[running, done]
    )
    reply = envelope(actions[0])
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "r"
    assert reply["payload"]["sessionId"] == "s-9"
    assert reply["payload"]["resumeToken"] == "token-new"
    assert actions[1:] == [
        StartTimer(call_id="c1", seconds=7.0),
        ClaimResult(call_id="c2", job_id="j2", response=None),
    ]
    assert session.state is ConnectionState.OPEN
    assert session.session_id == "s-9"
    assert session.generation == 3
    assert session.in_flight("c1") is not None
    assert session.in_flight("c2") is not None
    # A second initialize on this connection is refused as usual.
    again = sent(session.receive(Initialize(id="again")))["payload"]
    assert_error(again, "ALREADY_INITIALIZED")


def test_a_resume_lists_the_calls_it_holds_and_answers_awaited_ones_again() -> None:
    session = connected(limits=Limits(resumable=True))
    resume = ResumeRequest(session_id="s-9", token="tok", awaiting=("c1", "c3", "lost"))
    [action] = session.receive(Initialize(id="r", resume=resume))
    assert action == ResumeSession(session_id="s-9", token="tok", awaiting=("c1", "c3", "lost"))
    running = record("c1", job_id="j1", request_id="q1")
    # Answered on a socket that died unread: the agent still awaits it.
    answered = record("c3", job_id="j3", request_id="q3", status="succeeded", delivered=True)
    response = responses.succeeded("c3", {"ok": True}, 5)
    actions = session.resumed(
        action,
        token="t2",
        generation=1,
        was_held=False,
        calls=[running],
        again=[(answered, response)],
    )
    reply = envelope(actions[0])
    assert reply["payload"]["heldCalls"] == ["c1", "c3"]  # "lost" never reached the server
    assert actions[1] == StartTimer(call_id="c1", seconds=30.0)
    again = envelope(actions[2])
    assert again["type"] == "capabilities/call-result"
    assert again["id"] == "q3"
    assert again["payload"]["callId"] == "c3"
    assert isinstance(actions[2], Send)
    assert actions[2].claims is None  # delivered already: nothing to claim or give back
    assert session.in_flight("c3") is None


def test_a_result_answered_again_is_not_sent_twice_when_found_again() -> None:
    # The old connection claimed the result and wrote it to its dead socket; the resume
    # answered it again and claimed it for its own generation (fenced claims). A note
    # that finds it again adopts it only to lose the claim: nothing is sent twice.
    session = connected(limits=Limits(resumable=True))
    resume = ResumeRequest(session_id="s-9", token="tok", awaiting=("c3",))
    [action] = session.receive(Initialize(id="r", resume=resume))
    assert isinstance(action, ResumeSession)
    answered = record("c3", job_id="j3", request_id="q3", status="succeeded", delivered=True)
    response = responses.succeeded("c3", {"ok": True}, 5)
    actions = session.resumed(
        action, token="t2", generation=1, was_held=True, calls=[], again=[(answered, response)]
    )
    assert sum(isinstance(a, Send) and "call-result" in a.text for a in actions) == 1
    [look_up] = session.job_returned("j3")
    assert isinstance(look_up, LookUp)
    assert session.found(look_up, answered) == []  # delivered: not this one's to send
    claim = ClaimResult(call_id="c3", job_id="j3", response=None)
    assert session.found(look_up, replace(answered, delivered=False)) == [claim]
    assert session.result_claimed(claim, DELIVERED_ELSEWHERE) == [StopTimer(call_id="c3")]
    assert session.in_flight("c3") is None


def test_a_call_read_unanswered_then_answered_by_a_lingering_connection_is_sent_once() -> None:
    # The resume read the call unanswered, and the old connection claimed it before
    # `again` was read, so the resume has it twice: it is sent once, as an answer again.
    session = connected(limits=Limits(resumable=True))
    resume = ResumeRequest(session_id="s-9", token="tok", awaiting=("c3",))
    [action] = session.receive(Initialize(id="r", resume=resume))
    assert isinstance(action, ResumeSession)
    unanswered = record("c3", job_id="j3", request_id="q3", status="succeeded")
    answered = replace(unanswered, delivered=True)
    response = responses.succeeded("c3", {"ok": True}, 5)
    actions = session.resumed(
        action, token="t2", generation=1, was_held=True, calls=[unanswered],
        again=[(answered, response)],
    )  # fmt: skip
    assert envelope(actions[1])["payload"]["heldCalls"] == ["c3"]
    assert sum(isinstance(a, Send) and "call-result" in a.text for a in actions) == 1
    assert not any(isinstance(a, ClaimResult) for a in actions)
    assert session.in_flight("c3") is None


def test_a_fresh_initialize_result_has_no_held_calls() -> None:
    session = connected()
    [action] = session.receive(Initialize(id="i"))
    assert isinstance(action, OpenSession)
    assert "heldCalls" not in sent(session.opened(action))["payload"]


def test_a_resent_call_the_session_holds_is_neither_run_nor_refused() -> None:
    session = open_session()
    start(session, "c1")
    assert session.receive(call("c1", resent=True)) == []
    [starting] = session.receive(call("c2", message_id="req-2"))
    assert isinstance(starting, StartCall)
    assert session.receive(call("c2", message_id="req-2", resent=True)) == []  # held
    session.call_started(record("c2", job_id="job-2", request_id="req-2"))
    assert replayed(session) == []  # then dropped: that call, answered once
    # Not resent: the same callId is a mistake, and refused as one.
    assert_error(sent(session.receive(call("c1")))["payload"], "INVALID_PARAMS")
    # Resent, but another call: refused too.
    other = CallRequest(
        id="req-3", capability="export.pdf", params={"html": "other"},
        options=CallOptions(call_id="c1", resent=True),
    )  # fmt: skip
    assert_error(sent(session.receive(other))["payload"], "INVALID_PARAMS")


def test_a_resent_call_whose_first_copy_wrote_its_row_is_adopted() -> None:
    session = open_session()
    [action] = session.receive(call("c1", resent=True))
    assert isinstance(action, StartCall)
    # The first copy, brought in by the old socket, wrote its row meanwhile.
    written = record("c1", request_id="req-0", status="succeeded")
    assert session.call_adopted(action, written) == [
        ClaimResult(call_id="c1", job_id="job-1", response=None)
    ]
    held = session.in_flight("c1")
    assert held is not None
    assert (held.request_id, held.own) == ("req-0", False)  # answered as its first copy
    # Answered already, it is over: that call, answered once.
    [action] = session.receive(call("c2", message_id="req-2", resent=True))
    assert isinstance(action, StartCall)
    answered = record("c2", job_id="job-2", request_id="req-2", delivered=True)
    assert session.call_adopted(action, answered) == []
    assert session.in_flight("c2") is None


def test_a_resent_call_answered_on_an_older_connection_is_sent_again() -> None:
    # Its result went to the socket that died (written after the resume read the
    # session's calls): claimed for this connection, it is sent once more.
    session = open_session()
    [action] = session.receive(call("c1", message_id="req-2", resent=True))
    assert isinstance(action, StartCall)
    assert action.resent
    answered = record("c1", request_id="req-0", delivered=True, status="cancelled")
    response = {"success": False, "cancelled": True}
    reply = sent(session.call_adopted(action, answered, again=response))
    assert reply["id"] == "req-0"  # answered as its first copy asked
    assert reply["payload"]["cancelled"] is True
    assert session.in_flight("c1") is None
    # Its copy not marked re-sent is never sent anything again (that is a reused callId).
    [action] = session.receive(call("c2", message_id="req-3"))
    assert isinstance(action, StartCall)
    assert not action.resent


def test_a_call_not_marked_resent_whose_call_id_holds_the_same_call_is_refused() -> None:
    session = open_session()
    [action] = session.receive(call("c1", message_id="req-3"))
    assert isinstance(action, StartCall)
    reply = sent(session.call_adopted(action, record("c1", request_id="req-0")))
    assert reply["id"] == "req-3"
    assert_error(reply["payload"], "INVALID_PARAMS")
    assert session.in_flight("c1") is None


def test_a_cancel_of_any_call_being_started_tries_its_start() -> None:
    session = open_session()
    session.receive(call("c1", resent=True))
    by_call = CancelRequest(id="k-1", call_id="c1")
    assert session.receive(by_call) == [CancelStart(call_id="c1", reason="", message=by_call)]


def test_taking_over_a_held_session_tells_its_old_connection_first() -> None:
    session, action = resuming()
    actions = session.resumed(action, token="t", generation=2, was_held=True, calls=[])
    assert actions[0] == AnnounceTakeover(session_id="s-9", generation=2)
    assert envelope(actions[1])["type"] == "initialize-result"
    # Its own announcement comes back to it through the group: ignored.
    assert session.superseded(2) == []


def test_a_refused_resume_leaves_the_connection_free_to_initialize() -> None:
    session, _ = resuming("bad")
    error = WireError(code=ErrorCode.SESSION_EXPIRED, message="too late")
    reply = sent(session.resume_refused(error))
    assert reply["id"] == "r"
    assert_error(reply["payload"], "SESSION_EXPIRED")
    assert session.state is ConnectionState.NEW
    assert isinstance(session.receive(Initialize(id="fresh"))[0], OpenSession)


# -- takeover, key revocation -------------------------------------------------------------------


def test_a_superseded_connection_lets_go_and_closes() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.superseded(1) == [
        LetGo(),
        StopTimers(),
        Close(code=TAKEN_OVER_CLOSE_CODE),
    ]
    assert session.state is ConnectionState.SUPERSEDED
    # Frames it already brought in are handled; results go to the new holder.
    assert isinstance(session.receive(call("c-2"))[0], StartCall)
    assert session.job_settled("c-1", None) == []
    assert session.job_returned("job-1") == []
    # An older announcement changes nothing; neither does the disconnect, once c-2's
    # start has reported (it waits for that).
    assert session.superseded(0) == []
    assert session.disconnected(4409) == []
    session.call_started(record("c-2", job_id="job-2"))
    assert replayed(session) == [StopTimers()]


def test_revoking_the_key_before_initialize_refuses_the_connection() -> None:
    session = connected()
    actions = session.key_revoked()
    assert actions[1:] == [Close(code=4403)]
    assert envelope(actions[0])["payload"]["data"]["details"]["reason"] == "key-revoked"
    assert session.state is ConnectionState.REFUSED


def test_revoking_the_key_of_an_open_session_ends_its_calls_as_an_operator() -> None:
    session = open_session()
    start(session, "c-1")
    find, note, close, end = session.key_revoked()
    assert find == FindUnanswered(then=EndAll(source="operator", reason="agent key revoked"))
    assert envelope(note)["payload"]["data"]["details"] == {
        "reason": "key-revoked",
        "closeCode": 4403,
    }
    assert close == Close(code=4403)
    assert end == EndSession(session_id="id-1", reason="agent key revoked")
    [settle] = session.unanswered(find.then, [record("c-1")])
    assert isinstance(settle, SettleCancels)
    assert settle.source == "operator"
    actions = session.cancels_settled(settle, {"job-1": True})
    result = envelope(actions[1])
    assert result["payload"]["cancelled"] is True
    assert result["payload"]["error"]["message"] == "The call was cancelled (operator)."
    assert session.key_revoked() == []
    assert session.receive(call("c-2")) == []


def test_a_deactivated_users_session_ends_as_a_revoked_keys_does_with_its_own_reason() -> None:
    refused = connected().key_revoked("user-inactive")
    assert envelope(refused[0])["payload"]["data"]["details"]["reason"] == "user-inactive"
    session = open_session()
    start(session, "c-1")
    find, note, close, end = session.key_revoked("user-inactive")
    assert find == FindUnanswered(then=EndAll(source="operator", reason="user deactivated"))
    assert envelope(note)["payload"]["data"]["details"] == {
        "reason": "user-inactive",
        "closeCode": 4403,
    }
    assert close == Close(code=4403)
    assert end == EndSession(session_id="id-1", reason="user deactivated")


# -- found by the shell machine below --------------------------------------------------------


def test_a_returned_result_of_a_call_held_here_is_delivered() -> None:
    # job.returned (a give-back by another connection of the session, or the
    # reaper's nudge after a lost job.settled note) of a call this connection holds:
    # nothing happens, and the agent waits for the call's deadline.
    session = open_session()
    start(session, "c-1", job_id="j-1")
    [look_up] = session.job_returned("j-1")
    assert isinstance(look_up, LookUp)
    assert session.found(look_up, record("c-1", job_id="j-1", status="succeeded")) == [
        ClaimResult(call_id="c-1", job_id="j-1", response=None)
    ]


def test_a_revoked_key_s_session_answers_every_call_before_closing() -> None:
    session = open_session()
    start(session, "c-1", job_id="j-1")
    find = session.key_revoked()[0]
    assert isinstance(find, FindUnanswered)
    assert session.state is ConnectionState.ENDING
    theirs = record("c-2", job_id="j-2", request_id="r-2")
    # The other connection's call is adopted and ended too, as on shutdown.
    [settle] = session.unanswered(find.then, [record("c-1", job_id="j-1"), theirs])
    assert isinstance(settle, SettleCancels)
    assert settle.job_ids == ("j-1", "j-2")
    # revoke() cancelled the jobs first, so these settles lose: deliver what they were.
    assert session.cancels_settled(settle, {"j-1": False, "j-2": False}) == [
        ClaimResult(call_id="c-1", job_id="j-1", response=None),
        ClaimResult(call_id="c-2", job_id="j-2", response=None),
    ]


def test_a_late_timer_after_the_session_closed_does_nothing() -> None:
    # The consumer's timer callback may already be waiting on the lock when
    # StopTimers runs; a call whose disconnect-cancel lost is still in the table.
    session = open_session()
    start(session, "c-1")
    session.socket_gone()
    settle = session.disconnected(1006)[0]
    assert isinstance(settle, SettleCancels)
    assert session.cancels_settled(settle, {"job-1": False}) == []
    assert session.state is ConnectionState.CLOSED
    assert session.timed_out("c-1") == []


# -- the table of calls, with arbitrary facts ------------------------------------------------

CALL_IDS = ["a", "b", "c"]


class SessionTable(RuleBasedStateMachine):
    """Calls, starts, results, cancels, timeouts, shutdown and disconnect in any order.

    The shell's reports are drawn at random (a settle won or lost, a claim that
    succeeds, finds the job still running or finds it sent elsewhere), however
    unlikely together. The model is what should be in flight: started and not yet
    answered. A job answered twice is the bug this hunts for.
    """

    def __init__(self) -> None:
        super().__init__()
        self.session = new_session()
        self.open = True
        self.model: dict[str, str] = {}  # call_id -> job_id
        self.requests: dict[str, str] = {}  # job_id -> the request its result answers
        self.answered: set[str] = set()
        self.job_numbers: Iterator[int] = itertools.count()
        self.request_numbers: Iterator[int] = itertools.count()

    @initialize(limit=st.sampled_from([None, 1, 2]), resumable=st.booleans())
    def start_session(self, limit: int | None, resumable: bool) -> None:
        self.limit = limit
        self.session.accepted(Limits(max_queued_calls=limit, resumable=resumable))
        [action] = self.session.receive(Initialize(id="init"))
        assert isinstance(action, OpenSession)
        self.session.opened(action)

    def request_id(self) -> str:
        return f"r-{next(self.request_numbers)}"

    def perform(self, actions: list[Action]) -> None:
        """Check what the session sends; the facts are reported by the rules."""
        for action in actions:
            if not isinstance(action, Send):
                continue
            reply = envelope(action)
            if action.claims is None:
                continue
            assert reply["type"] == "capabilities/call-result"
            assert reply["id"] == self.requests[action.claims]
            assert action.claims not in self.answered, f"{action.claims} answered twice"
            self.answered.add(action.claims)
            self.model = {c: j for c, j in self.model.items() if j != action.claims}

    @rule(call_id=st.one_of(st.none(), st.sampled_from(CALL_IDS)), started=st.booleans())
    def send_call(self, call_id: str | None, started: bool) -> None:
        request_id = self.request_id()
        actions = self.session.receive(call(call_id, message_id=request_id))
        if not self.open:
            assert actions == []
            return
        if call_id in self.model or (self.limit is not None and len(self.model) >= self.limit):
            reply = sent(actions)
            assert reply["id"] == request_id
            code = "INVALID_PARAMS" if call_id in self.model else "RATE_LIMITED"
            assert reply["payload"]["error"]["code"] == code
            return
        [action] = actions
        assert isinstance(action, StartCall)
        assert action.request_id == request_id
        assert call_id is None or action.call_id == call_id
        if not started:  # the call service refused it
            error = WireError(code=ErrorCode.INTERNAL_ERROR, message="try again")
            assert sent(self.session.call_refused(action, error))["id"] == request_id
            return
        job_id = f"job-{next(self.job_numbers)}"
        started_actions = self.session.call_started(
            record(action.call_id, job_id=job_id, request_id=request_id)
        )
        assert started_actions == [StartTimer(call_id=action.call_id, seconds=30.0)]
        self.model[action.call_id] = job_id
        self.requests[job_id] = request_id

    def settled(self, actions: list[Action], claimed: Claimed) -> None:
        """Perform a settle's actions, answering each claim with `claimed`."""
        for action in actions:
            if isinstance(action, ClaimResult):
                assert self.model.get(action.call_id) == action.job_id
                answer = self.session.result_claimed(action, claimed)
                if claimed == DELIVERED_ELSEWHERE:
                    assert answer == [StopTimer(call_id=action.call_id)]
                    self.model.pop(action.call_id)
                self.perform(answer)
            else:
                self.perform([action])

    @rule(
        data=st.data(),
        claimed=st.sampled_from(["response", STILL_ACTIVE, DELIVERED_ELSEWHERE]),
    )
    def job_settles(self, data: st.DataObject, claimed: str) -> None:
        # A worker's note: any call id, in flight or not.
        call_id = data.draw(st.sampled_from(sorted({*CALL_IDS, *self.model})))
        actions = self.session.job_settled(call_id, None)
        if not self.open:  # closed, or detached: a resume finds the result
            assert actions == []
            return
        if call_id not in self.model:
            [look_up] = actions
            assert look_up == LookUp(call_id=call_id, then=DeliverFound())
            assert isinstance(look_up, LookUp)
            assert self.session.found(look_up, None) == []
            return
        [claim] = actions
        assert isinstance(claim, ClaimResult)
        response = succeeded(call_id)
        self.settled(actions, response if claimed == "response" else claimed)

    @rule(data=st.data(), won=st.booleans())
    def send_cancel(self, data: st.DataObject, won: bool) -> None:
        call_id = data.draw(st.sampled_from(sorted({*CALL_IDS, *self.model})))
        request_id = self.request_id()
        actions = self.session.receive(CancelRequest(id=request_id, call_id=call_id))
        if not self.open:
            assert actions == []
            return
        [action] = actions
        if call_id not in self.model:
            assert isinstance(action, LookUp)
            reply = sent(self.session.found(action, None))
            assert reply["payload"]["reason"] == replies.NOT_FOUND
            return
        assert isinstance(action, SettleCancels)
        job_id = self.model[call_id]
        response = succeeded(call_id)
        answer = self.session.cancels_settled(action, {job_id: won}, {job_id: response})
        cancel_reply = envelope(answer[0])
        assert cancel_reply["id"] == request_id
        assert cancel_reply["payload"]["cancelled"] is won
        if won:
            assert StopWork(job_id=job_id) in answer
        self.settled(answer, response)

    @rule(data=st.data(), won=st.booleans())
    def timer_fires(self, data: st.DataObject, won: bool) -> None:
        call_id = data.draw(st.sampled_from(sorted({*CALL_IDS, *self.model})))
        actions = self.session.timed_out(call_id)
        if call_id not in self.model:
            assert actions == []
            return
        [settle] = actions
        assert isinstance(settle, SettleCancels)
        assert settle.source == "timeout"
        job_id = self.model[call_id]
        self.settled(self.session.cancels_settled(settle, {job_id: won}), succeeded(call_id))

    @rule(won=st.booleans())
    def shutdown(self, won: bool) -> None:
        actions = self.session.receive(Shutdown(id="s"))
        if not self.open:
            assert actions == []
            return
        end, find, close = actions
        assert isinstance(end, EndSession)
        assert isinstance(find, FindUnanswered)
        assert close == Close(code=1000)
        self.open = False
        held = [record(c, job_id=j, request_id=self.requests[j]) for c, j in self.model.items()]
        for settle in self.session.unanswered(find.then, held):
            assert isinstance(settle, SettleCancels)
            assert set(settle.job_ids) == set(self.model.values())
            outcome = {job_id: won for job_id in settle.job_ids}
            self.settled(self.session.cancels_settled(settle, outcome), {"success": True})
        # Every call answered, whether its cancel won or lost.
        assert self.model == {}
        self.session.socket_gone()
        assert self.session.state is ConnectionState.CLOSED

    @rule(won=st.booleans())
    def disconnect(self, won: bool) -> None:
        was_open = self.open and self.session.state is ConnectionState.OPEN
        self.session.socket_gone()
        actions = self.session.disconnected(1006)
        self.open = False
        if not was_open:
            assert actions == [StopTimers()]
            return
        if self.session.limits.resumable:
            assert actions == [StopTimers(), Detach(session_id="id-1", generation=0)]
            self.model.clear()
            return
        settles = [a for a in actions if isinstance(a, SettleCancels)]
        for settle in settles:
            assert settle.delivered is False
            answer = self.session.cancels_settled(settle, {j: won for j in settle.job_ids})
            assert not any(isinstance(a, Send) for a in answer)
        # The session ended with its socket: no call is this connection's any more.
        self.model.clear()

    @invariant()
    def in_flight_is_started_and_not_answered(self) -> None:
        for call_id in {*CALL_IDS, *self.model}:
            in_flight = self.session.in_flight(call_id)
            assert (in_flight.job_id if in_flight else None) == self.model.get(call_id)


SessionTable.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, database=None
)
TestSessionTable = SessionTable.TestCase


# -- a whole shell: sockets, timers, notes, and a job table that settles once ----------------


MAX_TIMEOUT_MS = 60_000
HANDLES_FRAMES = (ConnectionState.OPEN, ConnectionState.GONE, ConnectionState.SUPERSEDED)


@dataclass
class StoredSession:
    """A session's row."""

    session_id: str
    token: str
    generation: int = 0
    detached: bool = False
    ended: bool = False


@dataclass
class StoredJob:
    """A job's row: settled once (first settle wins); its result claimed once."""

    job_id: str
    session_id: str
    call_id: str
    request_id: str
    status: str = "queued"
    delivered: bool = False
    response: dict[str, Any] | None = None
    digest: str = ""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def record(self) -> CallRecord:
        stored = record(
            self.call_id,
            job_id=self.job_id,
            request_id=self.request_id,
            status=self.status,
            delivered=self.delivered,
            progress_token="p",
        )
        return replace(stored, params_hash=self.digest)


@dataclass(frozen=True)
class Note:
    """A channel-layer note to a connection."""

    kind: str
    call_id: str = ""
    job_id: str = ""
    generation: int = 0
    response: dict[str, Any] | None = None


@dataclass(eq=False)
class Connection:
    """One socket and its Session, as the shell sees them."""

    name: str
    session: Session
    socket_open: bool = True
    close_code: int | None = None
    disconnected: bool = False
    group: str | None = None
    mailbox: deque[Note] = field(default_factory=deque)
    timers: set[str] = field(default_factory=set)
    stale: set[str] = field(default_factory=set)
    """Timers stopped after their callback may already have been queued."""

    def __repr__(self) -> str:
        return self.name


class ShellWorld(RuleBasedStateMachine):
    """A fake shell around real Sessions: one agent's session over many connections.

    Agent frames (calls, cancels, shutdown) on any connection, sockets that drop,
    disconnects, resumes and takeovers; workers that settle, report and whose notes
    arrive late or get lost; timers; operator cancels, a revoked key, the reaper's
    nudges and expiry. The job table settles once and claims once, as the DB does.

    Across every connection: each job's call-result reaches the agent at most once,
    and exactly when its delivery is claimed; a won cancel stops the work; a
    cancel-result says `cancelled: true` only for a job that ended cancelled; a
    closed session does nothing but what `disconnected` asks; and once notes and
    timers run out, every settled call of a held session has reached the agent.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[str, StoredSession] = {}
        self.jobs: dict[str, StoredJob] = {}
        self.by_request: dict[str, StoredJob] = {}
        self.connections: list[Connection] = []
        self.ids = counter("id")
        self.tokens = counter("token")
        self.job_numbers: Iterator[int] = itertools.count(1)
        self.request_numbers: Iterator[int] = itertools.count(1)
        self.limits = Limits()
        self.features = Features()
        self.agent_session: str | None = None
        self.agent_token: str | None = None
        self.revoked = False
        self.results: Counter[str] = Counter()  # job id -> call-results the agent got
        self.cancel_replies: Counter[str] = Counter()  # request id -> cancel-results
        self.sends: list[dict[str, Any]] = []
        self.unstopped: set[str] = set()  # cancels a session won, until it stops the work
        self.notes_lost = False

    # -- the agent --------------------------------------------------------------------

    @initialize(
        resumable=st.booleans(), limit=st.sampled_from([None, 2]), notifications=st.booleans()
    )
    def connect(self, resumable: bool, limit: int | None, notifications: bool) -> None:
        self.limits = Limits(
            max_queued_calls=limit,
            max_timeout_ms=lambda _name: MAX_TIMEOUT_MS,
            resumable=resumable,
        )
        self.features = Features(notifications=notifications, progress=True)
        conn = self.new_connection()
        self.feed(conn, "receive", lambda: conn.session.receive(self.initialize()))
        assert conn.session.state is ConnectionState.OPEN
        assert self.agent_session is not None

    def initialize(self, resume: ResumeRequest | None = None) -> Initialize:
        return Initialize(id=self.request_id(), features=self.features, resume=resume)

    def request_id(self) -> str:
        return f"req-{next(self.request_numbers)}"

    def new_connection(self) -> Connection:
        session = Session(
            capability_names=lambda: list(NAMES),
            app=dict(APP),
            new_id=self.ids,
            new_token=self.tokens,
        )
        conn = Connection(name=f"conn-{len(self.connections) + 1}", session=session)
        self.connections.append(conn)
        if self.revoked:
            self.perform(conn, session.refuse("key-revoked"))
        else:
            assert session.accepted(self.limits) == []
        return conn

    def live(self) -> list[Connection]:
        """Connections whose disconnect has not arrived: frames may still be in flight."""
        return [conn for conn in self.connections if not conn.disconnected]

    def pick(self, data: st.DataObject, connections: list[Connection]) -> Connection:
        name = data.draw(st.sampled_from([conn.name for conn in connections]), label="connection")
        return next(conn for conn in connections if conn.name == name)

    def replies_to(self, request_id: str) -> list[dict[str, Any]]:
        return [reply for reply in self.sends if reply["id"] == request_id]

    @precondition(lambda self: bool(self.live()))
    @rule(
        data=st.data(),
        call_id=st.one_of(st.none(), st.sampled_from(CALL_IDS)),
        capability=st.sampled_from([NAMES[0], NAMES[1], "nope"]),
        timeout_ms=st.sampled_from([None, 1000, MAX_TIMEOUT_MS + 1]),
        resent=st.booleans(),
    )
    def agent_calls(
        self,
        data: st.DataObject,
        call_id: str | None,
        capability: str,
        timeout_ms: int | None,
        resent: bool,
    ) -> None:
        conn = self.pick(data, self.live())
        request_id = self.request_id()
        state, session_id = conn.session.state, conn.session.session_id
        held = {job.call_id: job for job in self.held(conn)}
        stored = self.job_of(session_id, call_id or "") if session_id is not None else None
        digest = call_digest(capability, {})
        same_call = resent and call_id is not None and stored is not None
        same_call = same_call and stored is not None and stored.digest == digest
        limit = self.limits.max_queued_calls
        expected = (
            "SAME_CALL"  # a call this connection holds, re-sent: answered once
            if same_call and call_id in held
            else "INVALID_PARAMS"
            if call_id in held
            else "UNKNOWN_CAPABILITY"
            if capability not in NAMES
            else "INVALID_PARAMS"
            if timeout_ms is not None and timeout_ms > MAX_TIMEOUT_MS
            else "RATE_LIMITED"
            if limit is not None and len(held) >= limit
            else "SAME_CALL"  # the call service's: that call, adopted
            if same_call
            else "INVALID_PARAMS"  # the call service's: another call with a used callId
            if stored is not None
            else None
        )
        message = CallRequest(
            id=request_id,
            capability=capability,
            options=CallOptions(
                call_id=call_id, timeout_ms=timeout_ms, progress_token="p", resent=resent
            ),
        )
        self.feed(conn, "receive", lambda: conn.session.receive(message))
        replies_ = self.replies_to(request_id)
        if state is ConnectionState.NEW:
            [reply] = replies_
            assert reply["payload"]["error"]["code"] == "NOT_INITIALIZED"
            return
        if state not in HANDLES_FRAMES:
            assert replies_ == []
            return
        if expected is None:
            assert replies_ == []
            assert request_id in self.by_request
        elif expected == "SAME_CALL":
            assert replies_ == []
            assert request_id not in self.by_request
        else:
            [reply] = replies_
            assert reply["type"] == "capabilities/call-result"
            assert reply["payload"]["error"]["code"] == expected
            assert request_id not in self.by_request

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data(), call_id=st.sampled_from([*CALL_IDS, "ghost"]))
    def agent_cancels(self, data: st.DataObject, call_id: str) -> None:
        conn = self.pick(data, self.live())
        request_id = self.request_id()
        state, session_id = conn.session.state, conn.session.session_id
        job = self.job_of(session_id, call_id) if session_id is not None else None
        was_active = job is not None and job.active
        message = CancelRequest(id=request_id, call_id=call_id)
        self.feed(conn, "receive", lambda: conn.session.receive(message))
        replies_ = self.replies_to(request_id)
        if state is ConnectionState.NEW:
            [reply] = replies_
            assert reply["payload"]["error"]["code"] == "NOT_INITIALIZED"
            return
        if state not in HANDLES_FRAMES:
            assert replies_ == []
            return
        [reply] = replies_
        assert reply["type"] == "capabilities/cancel-result"
        if job is None:
            assert reply["payload"]["reason"] == replies.NOT_FOUND
        if was_active and state is ConnectionState.OPEN:
            # Nothing runs between the frame and its settle: the cancel wins.
            assert job is not None
            assert job.status == "cancelled"
            assert reply["payload"] == {"callId": call_id, "cancelled": True}

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data(), reason=st.sampled_from([None, "bye"]))
    def agent_shuts_down(self, data: st.DataObject, reason: str | None) -> None:
        conn = self.pick(data, self.live())
        state, socket_open = conn.session.state, conn.socket_open
        message = Shutdown(id=self.request_id(), reason=reason)
        self.feed(conn, "receive", lambda: conn.session.receive(message))
        if state is ConnectionState.OPEN and socket_open:
            assert conn.session.state is ConnectionState.CLOSED
            assert conn.close_code == 1000
            session_id = conn.session.session_id
            assert session_id is not None
            assert self.sessions[session_id].ended
            # Every call of the session was answered before the close.
            for job in self.jobs_of(session_id):
                assert self.results[job.job_id] == 1, job

    @precondition(lambda self: any(conn.socket_open for conn in self.connections))
    @rule(data=st.data())
    def socket_drops(self, data: st.DataObject) -> None:
        open_sockets = [conn for conn in self.connections if conn.socket_open]
        conn = self.pick(data, open_sockets)
        conn.socket_open, conn.close_code = False, 1006

    @precondition(
        lambda self: any(
            not conn.socket_open and not conn.disconnected for conn in self.connections
        )
    )
    @rule(data=st.data())
    def disconnect_arrives(self, data: st.DataObject) -> None:
        closing = [conn for conn in self.live() if not conn.socket_open]
        self.disconnect(self.pick(data, closing))

    def disconnect(self, conn: Connection) -> None:
        state = conn.session.state
        assert conn.session.socket_gone() == []
        actions = conn.session.disconnected(conn.close_code or 1006)
        if state not in (ConnectionState.OPEN, ConnectionState.GONE):
            assert actions == [StopTimers()]
        self.perform(conn, actions)
        assert conn.timers == set()
        assert conn.session.state in (ConnectionState.CLOSED, ConnectionState.DETACHED)
        conn.disconnected, conn.group = True, None
        conn.mailbox.clear()

    @precondition(lambda self: any(conn.socket_open for conn in self.live()))
    @rule(data=st.data())
    def connection_drops(self, data: st.DataObject) -> None:
        """The socket drops and its disconnect arrives, nothing in between."""
        open_sockets = [conn for conn in self.live() if conn.socket_open]
        conn = self.pick(data, open_sockets)
        conn.socket_open, conn.close_code = False, 1006
        self.disconnect(conn)

    @precondition(lambda self: self.agent_session is not None)
    @rule()
    def agent_resumes(self) -> None:
        assert self.agent_session is not None
        assert self.agent_token is not None
        conn = self.new_connection()
        if self.revoked:
            assert conn.session.state is ConnectionState.REFUSED
            return
        row = self.sessions[self.agent_session]
        resumable = self.limits.resumable and not row.ended
        message = self.initialize(ResumeRequest(session_id=row.session_id, token=self.agent_token))
        self.feed(conn, "receive", lambda: conn.session.receive(message))
        [reply] = self.replies_to(str(message.id))
        if resumable:
            assert reply["payload"]["sessionId"] == row.session_id
            assert conn.session.state is ConnectionState.OPEN
            assert conn.session.generation == row.generation
        else:
            assert "error" in reply["payload"]
            assert conn.session.state is ConnectionState.NEW

    # -- workers, operators, the reaper --------------------------------------------------

    def active_jobs(self) -> list[StoredJob]:
        return [job for job in self.jobs.values() if job.active]

    @precondition(lambda self: bool(self.active_jobs()))
    @rule(data=st.data(), status=st.sampled_from(["succeeded", "failed"]), carry=st.booleans())
    def worker_settles(self, data: st.DataObject, status: str, carry: bool) -> None:
        job = data.draw(st.sampled_from(self.active_jobs()), label="job")
        error = WireError(code=ErrorCode.OPERATION_FAILED, message="Bad input.")
        response = (
            succeeded(job.call_id)
            if status == "succeeded"
            else responses.failed(job.call_id, error, 5)
        )
        assert self.settle(job, status, response)
        # The note carries small results, saving the consumer a read.
        note = Note("settled", call_id=job.call_id, response=response if carry else None)
        self.notify(job.session_id, note)

    @precondition(lambda self: bool(self.active_jobs()))
    @rule(data=st.data(), kind=st.sampled_from(["started", "progress"]))
    def worker_reports(self, data: st.DataObject, kind: str) -> None:
        job = data.draw(st.sampled_from(self.active_jobs()), label="job")
        self.notify(job.session_id, Note(kind, call_id=job.call_id))

    @precondition(lambda self: bool(self.active_jobs()))
    @rule(data=st.data())
    def operator_cancels(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.active_jobs()), label="job")
        self.cancel_elsewhere(job, "operator")

    def cancel_elsewhere(self, job: StoredJob, source: str) -> None:
        """cancellation.cancel: settle, raise the flag, tell the session (no response)."""
        if self.settle(job, "cancelled", responses.cancelled(job.call_id, source, 5)):
            self.notify(job.session_id, Note("settled", call_id=job.call_id))

    @precondition(lambda self: not self.revoked)
    @rule()
    def key_is_revoked(self) -> None:
        # key_revocation.revoke: its calls cancelled first, then its connections told.
        self.revoked = True
        for job in self.active_jobs():
            self.cancel_elsewhere(job, "operator")
        for conn in self.live():
            conn.mailbox.append(Note("key_revoked"))

    @rule()
    def reaper_nudges(self) -> None:
        self.nudge()

    @precondition(
        lambda self: (
            self.agent_session is not None
            and self.sessions[self.agent_session].detached
            and not self.sessions[self.agent_session].ended
        )
    )
    @rule()
    def reaper_expires(self) -> None:
        assert self.agent_session is not None
        self.sessions[self.agent_session].ended = True
        for job in self.jobs_of(self.agent_session):
            if job.active:
                self.cancel_elsewhere(job, "disconnect")

    def nudge(self) -> None:
        """resumption.nudge_undelivered: settled results nobody claimed, announced again."""
        row = self.sessions.get(self.agent_session or "")
        if row is None or row.ended or row.detached:
            return
        for job in self.jobs_of(row.session_id):
            if not job.active and not job.delivered:
                self.notify(row.session_id, Note("returned", job_id=job.job_id))

    # -- notes and timers ----------------------------------------------------------------

    @precondition(lambda self: any(conn.mailbox for conn in self.live()))
    @rule(data=st.data())
    def note_arrives(self, data: st.DataObject) -> None:
        waiting = [conn for conn in self.live() if conn.mailbox]
        conn = self.pick(data, waiting)
        self.handle(conn, conn.mailbox.popleft())

    @precondition(
        lambda self: any(
            note.kind in ("settled", "returned", "started", "progress")
            for conn in self.live()
            for note in conn.mailbox
        )
    )
    @rule(data=st.data())
    def note_is_lost(self, data: st.DataObject) -> None:
        # A lost job note loses nothing: outcomes are in the DB (and the reaper nudges).
        losable = [
            (conn, note)
            for conn in self.live()
            for note in conn.mailbox
            if note.kind in ("settled", "returned", "started", "progress")
        ]
        conn, note = data.draw(st.sampled_from(losable), label="note")
        conn.mailbox.remove(note)
        self.notes_lost = True

    @precondition(lambda self: any(conn.timers for conn in self.live()))
    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        due = [(conn, call_id) for conn in self.live() for call_id in sorted(conn.timers)]
        conn, call_id = data.draw(st.sampled_from(due), label="timer")
        self.fire(conn, call_id)

    @precondition(lambda self: any(conn.stale for conn in self.connections))
    @rule(data=st.data())
    def stale_timer_fires(self, data: st.DataObject) -> None:
        # The consumer's timer callback was already waiting for the lock when the
        # timer was stopped; it runs anyway, even after the disconnect.
        late = [(conn, call_id) for conn in self.connections for call_id in sorted(conn.stale)]
        conn, call_id = data.draw(st.sampled_from(late), label="stale timer")
        conn.stale.discard(call_id)
        self.feed(conn, "timed_out", lambda: conn.session.timed_out(call_id))

    def fire(self, conn: Connection, call_id: str) -> None:
        conn.timers.discard(call_id)
        self.feed(conn, "timed_out", lambda: conn.session.timed_out(call_id))

    def handle(self, conn: Connection, note: Note) -> None:
        session = conn.session
        if note.kind == "settled":
            self.feed(conn, "job_settled", lambda: session.job_settled(note.call_id, note.response))
        elif note.kind == "returned":
            self.feed(conn, "job_returned", lambda: session.job_returned(note.job_id))
        elif note.kind == "started":
            self.feed(conn, "job_started", lambda: session.job_started(note.call_id))
        elif note.kind == "progress":
            self.feed(
                conn,
                "job_progress",
                lambda: session.job_progress(note.call_id, progress=1.0, total=2.0, stage="half"),
            )
        elif note.kind == "superseded":
            self.feed(conn, "superseded", lambda: session.superseded(note.generation))
        else:
            assert note.kind == "key_revoked"
            state, socket_open = session.state, conn.socket_open
            self.feed(conn, "key_revoked", session.key_revoked)
            if state is ConnectionState.OPEN and socket_open:
                assert conn.close_code == 4403
                assert session.session_id is not None
                assert self.sessions[session.session_id].ended
                for job in self.jobs_of(session.session_id):
                    assert self.results[job.job_id] == 1, job

    def drain(self, *, timers: bool) -> None:
        """Deliver every note (and fire every timer) until nothing is left."""
        for _ in range(10_000):
            waiting = [conn for conn in self.live() if conn.mailbox]
            if waiting:
                self.handle(waiting[0], waiting[0].mailbox.popleft())
                continue
            due = [(conn, call_id) for conn in self.live() for call_id in sorted(conn.timers)]
            if not timers or not due:
                return
            self.fire(*due[0])
        raise AssertionError("notes and timers never ran out")

    # -- the shell ---------------------------------------------------------------------

    def feed(self, conn: Connection, what: str, make: Callable[[], list[Action]]) -> None:
        """Report an input to the session and perform what it asks."""
        was = conn.session.state
        actions = make()
        if was is ConnectionState.CLOSED:
            assert actions == [], f"{what} after CLOSED: {actions}"
        self.perform(conn, actions)

    def perform(self, conn: Connection, actions: list[Action]) -> None:
        for action in actions:
            self.perform(conn, self.perform_one(conn, action))

    def perform_one(self, conn: Connection, action: Action) -> list[Action]:
        session = conn.session
        match action:
            case Send():
                self.check_send(conn, action)
                return [] if conn.socket_open else session.send_dropped(action.claims)
            case Close():
                if conn.socket_open:
                    conn.socket_open, conn.close_code = False, action.code
                return session.socket_gone()
            case StartTimer():
                conn.timers.add(action.call_id)
            case StopTimer():
                if action.call_id in conn.timers:
                    conn.timers.discard(action.call_id)
                    conn.stale.add(action.call_id)
            case StopTimers():
                conn.stale |= conn.timers
                conn.timers.clear()
            case StopWork():
                assert self.jobs[action.job_id].status == "cancelled"
                assert action.job_id in self.unstopped, f"{action.job_id} stopped twice"
                self.unstopped.discard(action.job_id)
            case GiveBack():
                job = self.jobs[action.job_id]
                assert job.delivered
                job.delivered = False
                self.notify(job.session_id, Note("returned", job_id=job.job_id))
            case Detach():
                row = self.sessions[action.session_id]
                if row.generation == action.generation and not row.ended:
                    row.detached = True
            case AnnounceTakeover():
                self.notify(action.session_id, Note("superseded", generation=action.generation))
            case EndSession():
                self.sessions[action.session_id].ended = True
            case OpenSession():
                self.sessions[action.session_id] = StoredSession(
                    action.session_id, action.resume_token
                )
                conn.group = action.session_id
                return session.opened(action)
            case ResumeSession():
                return self.resume(conn, action)
            case StartCall():
                return self.start_call(conn, action)
            case SettleCancels():
                return self.settle_cancels(conn, action)
            case ClaimResult():
                return session.result_claimed(action, self.claim(action))
            case LookUp():
                return session.found(action, self.look_up(conn, action))
            case FindUnanswered():
                assert session.session_id is not None
                pending = [job for job in self.jobs_of(session.session_id) if not job.delivered]
                return session.unanswered(action.then, [job.record() for job in pending])
        return []

    def check_send(self, conn: Connection, action: Send) -> None:
        reply = envelope(action)
        self.sends.append(reply)
        payload = reply["payload"]
        job = self.by_request.get(reply["id"])
        if reply["type"] == "capabilities/call-result" and job is not None:
            # A job's result: sent once claimed, carrying its claim, saying how it ended.
            assert action.claims == job.job_id
            assert job.delivered
            assert not job.active
            assert payload["callId"] == job.call_id
            assert payload["success"] is (job.status == "succeeded")
            assert payload.get("cancelled", False) is (job.status == "cancelled")
        else:
            assert action.claims is None
        if reply["type"] == "capabilities/cancel-result":
            self.cancel_replies[reply["id"]] += 1
            assert self.cancel_replies[reply["id"]] == 1, "two cancel-results for one cancel"
            if "error" not in payload:
                assert conn.session.session_id is not None
                cancelled = self.job_of(conn.session.session_id, payload["callId"])
                if payload["cancelled"]:
                    assert cancelled is not None
                    assert cancelled.status == "cancelled"
                elif payload["reason"] == replies.NOT_FOUND:
                    assert cancelled is None
                elif conn.socket_open:  # what the agent reads
                    assert payload["reason"] == replies.ALREADY_COMPLETED
                    assert cancelled is not None
                    assert cancelled.status in ("succeeded", "failed")
        if not conn.socket_open:
            return
        if job is not None and reply["type"] == "capabilities/call-result":
            self.results[job.job_id] += 1
            assert self.results[job.job_id] == 1, f"{job} answered twice"
        if reply["type"] == "initialize-result" and "sessionId" in payload:
            self.agent_session, self.agent_token = payload["sessionId"], payload["resumeToken"]

    # -- the database --------------------------------------------------------------------

    def jobs_of(self, session_id: str) -> list[StoredJob]:
        return [job for job in self.jobs.values() if job.session_id == session_id]

    def job_of(self, session_id: str, call_id: str) -> StoredJob | None:
        return next((job for job in self.jobs_of(session_id) if job.call_id == call_id), None)

    def held(self, conn: Connection) -> list[StoredJob]:
        session_id = conn.session.session_id
        if session_id is None:
            return []
        return [job for job in self.jobs_of(session_id) if conn.session.in_flight(job.call_id)]

    def notify(self, session_id: str, note: Note) -> None:
        for conn in self.live():
            if conn.group == session_id:
                conn.mailbox.append(note)

    def settle(
        self, job: StoredJob, status: str, response: dict[str, Any], *, delivered: bool = False
    ) -> bool:
        if not job.active:
            return False
        job.status, job.response = status, response
        job.delivered = job.delivered or delivered
        return True

    def claim(self, action: ClaimResult) -> Claimed:
        job = self.jobs[action.job_id]
        if job.active:
            return STILL_ACTIVE
        if job.delivered:
            return DELIVERED_ELSEWHERE
        job.delivered = True
        response = action.response if action.response is not None else job.response
        assert response is not None
        return response

    def look_up(self, conn: Connection, action: LookUp) -> CallRecord | None:
        session_id = conn.session.session_id
        assert session_id is not None
        for job in self.jobs_of(session_id):
            if job.call_id == action.call_id or job.job_id == action.job_id:
                return job.record()
        return None

    def resume(self, conn: Connection, action: ResumeSession) -> list[Action]:
        row = self.sessions.get(action.session_id)
        if row is None or row.ended or row.token != action.token:
            error = WireError(code=ErrorCode.SESSION_INVALID, message="Cannot be resumed.")
            return conn.session.resume_refused(error)
        conn.group = row.session_id  # joined before the jobs are read
        row.generation += 1
        was_held, row.detached, row.token = not row.detached, False, self.tokens()
        pending = [job.record() for job in self.jobs_of(row.session_id) if not job.delivered]
        return conn.session.resumed(
            action, token=row.token, generation=row.generation, was_held=was_held, calls=pending
        )

    def start_call(self, conn: Connection, action: StartCall) -> list[Action]:
        session_id = conn.session.session_id
        assert session_id is not None
        stored = self.job_of(session_id, action.call_id)
        if stored is not None and stored.digest == action.params_hash:
            return conn.session.call_adopted(action, stored.record())
        if stored is not None:
            error = WireError(code=ErrorCode.INVALID_PARAMS, message="callId already used.")
            return conn.session.call_refused(action, error)
        job = StoredJob(
            job_id=f"job-{next(self.job_numbers)}",
            session_id=session_id,
            call_id=action.call_id,
            request_id=action.stored_request_id,
            digest=action.params_hash,
        )
        self.jobs[job.job_id] = self.by_request[job.request_id] = job
        return conn.session.call_started(job.record())

    def settle_cancels(self, conn: Connection, action: SettleCancels) -> list[Action]:
        won: dict[str, bool] = {}
        for call_id, job_id in zip(action.call_ids, action.job_ids, strict=True):
            job = self.jobs[job_id]
            assert job.call_id == call_id
            assert job.session_id == conn.session.session_id
            cancelled = responses.cancelled(call_id, action.source, 5)
            won[job_id] = self.settle(job, "cancelled", cancelled, delivered=action.delivered)
            if won[job_id]:
                self.unstopped.add(job_id)
        losers = (
            {job_id: self.jobs[job_id].response for job_id, ok in won.items() if not ok}
            if action.read_losers
            else {}
        )
        return conn.session.cancels_settled(action, won, losers)

    # -- what holds -----------------------------------------------------------------------

    @invariant()
    def a_result_reaches_the_agent_exactly_when_its_delivery_is_claimed(self) -> None:
        for job in self.jobs.values():
            assert self.results[job.job_id] == int(job.delivered), job

    @invariant()
    def every_won_cancel_stopped_its_work(self) -> None:
        assert self.unstopped == set()

    @invariant()
    def timers_run_only_for_calls_held(self) -> None:
        for conn in self.live():
            for call_id in conn.timers:
                assert conn.session.in_flight(call_id) is not None, (conn, call_id)

    @invariant()
    def calls_held_are_their_session_s_jobs(self) -> None:
        for conn in self.live():
            for job in self.held(conn):
                in_flight = conn.session.in_flight(job.call_id)
                assert in_flight is not None
                assert (in_flight.job_id, in_flight.request_id) == (job.job_id, job.request_id)

    def holder(self) -> Connection | None:
        """The connection holding the agent's session open, if its socket is up."""
        holding = [conn for conn in self.live() if conn.session.state is ConnectionState.OPEN]
        assert len(holding) <= 1, holding
        row = self.sessions.get(self.agent_session or "")
        if not holding or not holding[0].socket_open or row is None or row.ended:
            return None
        return holding[0]

    @rule()
    def notes_run_out(self) -> None:
        """Every note arrives: the settled calls of a held session are sent.

        Without the reaper's nudge if no note was lost; with it otherwise.
        """
        self.drain(timers=False)
        if not self.notes_lost:
            self.check_everything_settled_was_sent()
        self.nudge()
        self.drain(timers=False)
        self.check_everything_settled_was_sent()

    def check_everything_settled_was_sent(self) -> None:
        holder = self.holder()
        if holder is None:
            return
        assert holder.group is not None
        for job in self.jobs_of(holder.group):
            if job.active or job.delivered:
                continue
            raise AssertionError(f"{job} settled, not sent, while {holder} holds the session")

    def teardown(self) -> None:
        self.notes_run_out()
        # Once every timer fired too, whatever held the session has sent everything.
        self.drain(timers=True)
        self.nudge()
        self.drain(timers=True)
        holder = self.holder()
        if holder is not None:
            assert holder.group is not None
            for job in self.jobs_of(holder.group):
                assert job.delivered or job.active, f"{job} never sent"
                assert not holder.session.in_flight(job.call_id) or job.active


ShellWorld.TestCase.settings = settings(
    max_examples=500, stateful_step_count=40, deadline=None, database=None
)
TestShellWorld = ShellWorld.TestCase
