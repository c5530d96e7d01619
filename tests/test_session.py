"""The per-connection state machine: messages in, actions out."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from capabilities.protocol import (
    AgentInfo,
    CallOptions,
    CallRequest,
    CancelRequest,
    ElicitationResponse,
    ErrorCode,
    Features,
    Initialize,
    Message,
    ProtocolError,
    ResumeRequest,
    Shutdown,
    WireError,
    decode,
)
from capabilities.session import (
    Action,
    CancelCall,
    Close,
    Detach,
    EndCalls,
    InFlight,
    OpenSession,
    ResumeSession,
    Send,
    Session,
    SessionState,
    StartCall,
)

NAMES = ["export.pdf", "process.image", "convert.markdownToHtml"]
APP = {"id": "abp-jobs", "name": "ABP Jobs", "version": "0.1.0", "description": "Jobs."}


def counter(prefix: str = "id") -> Callable[[], str]:
    numbers: Iterator[int] = itertools.count(1)
    return lambda: f"{prefix}-{next(numbers)}"


def new_session(names: list[str] | None = None, *, resumable: bool = False) -> Session:
    return Session(
        capability_names=lambda: list(NAMES if names is None else names),
        app=dict(APP),
        new_id=counter(),
        new_token=counter("token"),
        resumable=resumable,
    )


def open_session(features: Features | None = None) -> Session:
    session = new_session()
    session.receive(Initialize(id="init", features=features or Features()))
    assert session.state is SessionState.OPEN
    return session


def sent(actions: list[Action]) -> dict[str, Any]:
    """The one envelope the actions send."""
    assert len(actions) == 1
    assert isinstance(actions[0], Send)
    envelope: dict[str, Any] = json.loads(actions[0].text)
    assert set(envelope) == {"type", "id", "timestamp", "payload"}
    assert type(envelope["timestamp"]) is int
    return envelope


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


def start(session: Session, call_id: str, *, job_id: str = "job-1") -> None:
    session.call_started(call_id=call_id, request_id="req-1", job_id=job_id, progress_token=None)


def assert_error(payload: dict[str, Any], code: str) -> dict[str, Any]:
    error: dict[str, Any] = payload["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["retryable"] is False
    return error


# -- initialize --------------------------------------------------------------------------


def test_initialize_opens_the_session() -> None:
    session = new_session()
    message = Initialize(
        id="init-7",
        agent=AgentInfo(name="agent", version="2"),
        features=Features(notifications=True, progress=False, elicitation=True),
    )
    actions = session.receive(message)
    assert actions[0] == OpenSession(session_id="id-1", message=message, resume_token="token-1")
    reply = sent(actions[1:])
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
    assert session.state is SessionState.OPEN
    assert session.session_id == "id-1"
    assert session.features == message.features


def test_initialize_echoes_the_features_asked_for() -> None:
    session = new_session()
    actions = session.receive(Initialize(id="i", features=Features(progress=True)))
    assert sent(actions[1:])["payload"]["features"] == {
        "notifications": False,
        "progress": True,
        "elicitation": False,
    }


def test_capability_names_are_read_at_initialize() -> None:
    names: list[str] = []
    session = Session(capability_names=lambda: list(names), app={}, new_id=counter())
    names.append("late.one")
    actions = session.receive(Initialize(id="i"))
    assert sent(actions[1:])["payload"]["capabilities"] == [{"name": "late.one", "available": True}]


def test_second_initialize_is_already_initialized() -> None:
    session = open_session()
    reply = sent(session.receive(Initialize(id="again")))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "again"
    assert set(reply["payload"]) == {"error"}
    assert_error(reply["payload"], "ALREADY_INITIALIZED")
    assert session.state is SessionState.OPEN
    assert session.session_id == "id-1"


def test_initialize_with_resume_is_session_invalid_when_resuming_is_off() -> None:
    session = new_session()
    resume = ResumeRequest(session_id="old", token="tok")
    reply = sent(session.receive(Initialize(id="r", resume=resume)))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "r"
    assert set(reply["payload"]) == {"error"}
    assert_error(reply["payload"], "SESSION_INVALID")
    assert session.state is SessionState.NEW
    assert session.session_id is None
    # The connection can still start a fresh session.
    assert isinstance(session.receive(Initialize(id="i"))[0], OpenSession)


# -- before initialize ---------------------------------------------------------------------


def test_call_before_initialize() -> None:
    session = new_session()
    reply = sent(session.receive(call("c-1", message_id="early")))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "early"
    assert reply["payload"]["success"] is False
    assert reply["payload"]["metadata"] == {"duration": 0}
    assert_error(reply["payload"], "NOT_INITIALIZED")
    assert session.state is SessionState.NEW


def test_cancel_before_initialize() -> None:
    reply = sent(new_session().receive(CancelRequest(id="k", call_id="c-1")))
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
    session = new_session()
    reply = sent(session.receive(message))
    assert reply["type"] == "notification"
    assert reply["id"] != "s"
    assert reply["payload"]["event"] == "notifications/error"
    data = reply["payload"]["data"]
    assert data["code"] == "NOT_INITIALIZED"
    assert data["requestId"] == "s"
    assert data["requestType"] == request_type
    assert session.state is SessionState.NEW


def test_protocol_error_of_a_call_before_initialize_is_not_initialized() -> None:
    error = refusal(frame("capabilities/call", {"params": {}}, "early"))
    reply = sent(new_session().receive(error))
    assert reply["type"] == "capabilities/call-result"
    assert reply["id"] == "early"
    assert reply["payload"]["success"] is False
    assert_error(reply["payload"], "NOT_INITIALIZED")


def test_protocol_error_of_an_initialize_keeps_its_code() -> None:
    session = new_session()
    error = refusal(frame("initialize", {"features": []}, "i-1"))
    reply = sent(session.receive(error))
    assert reply["type"] == "initialize-result"
    assert reply["id"] == "i-1"
    assert assert_error(reply["payload"], "INVALID_TYPE")["details"] == {"path": "payload.features"}
    assert session.state is SessionState.NEW


def test_unparsable_frame_before_initialize_is_a_parse_error_notification() -> None:
    reply = sent(new_session().receive(refusal("{oops")))
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
    assert session.state is SessionState.OPEN


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
    assert session.state is SessionState.OPEN


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
            call_id="c-9",
            capability="process.image",
            params={"image": {"content": "AA=="}, "operations": []},
            timeout_ms=5000,
            progress_token=42,
        )
    ]
    # Not in flight until the consumer reports the job exists.
    assert session.in_flight("c-9") is None


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
    assert session.in_flight_calls() == []


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


def test_call_id_can_be_reused_once_finished() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.finish("c-1") is not None
    [action] = session.receive(call("c-1"))
    assert isinstance(action, StartCall)
    assert action.call_id == "c-1"


def test_finish_returns_the_call_once() -> None:
    session = open_session()
    session.call_started(call_id="c-1", request_id="req-3", job_id="job-3", progress_token="tok")
    expected = InFlight(call_id="c-1", request_id="req-3", job_id="job-3", progress_token="tok")
    assert session.in_flight("c-1") == expected
    assert session.in_flight_calls() == [expected]
    assert session.finish("c-1") == expected
    assert session.finish("c-1") is None
    assert session.in_flight("c-1") is None
    assert session.in_flight_calls() == []
    assert session.finish("never") is None


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_of_a_call_in_flight() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.receive(CancelRequest(id="k-1", call_id="c-1", reason="stop")) == [
        CancelCall(request_id="k-1", call_id="c-1", reason="stop", in_flight=True)
    ]
    # The session only reports; the consumer settles the call with finish.
    assert session.in_flight("c-1") is not None


def test_cancel_of_an_unknown_call() -> None:
    session = open_session()
    assert session.receive(CancelRequest(id="k-2", call_id="ghost")) == [
        CancelCall(request_id="k-2", call_id="ghost", reason="", in_flight=False)
    ]


def test_cancel_of_a_finished_call_is_not_in_flight() -> None:
    session = open_session()
    start(session, "c-1")
    session.finish("c-1")
    [action] = session.receive(CancelRequest(id="k", call_id="c-1"))
    assert isinstance(action, CancelCall)
    assert action.in_flight is False


# -- shutdown and disconnect ------------------------------------------------------------------


def test_shutdown_ends_calls_then_closes() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.receive(Shutdown(id="s", reason="bye")) == [
        EndCalls(reason="bye", source="shutdown"),
        Close(code=1000),
    ]
    assert session.state is SessionState.CLOSED
    # EndCalls is the consumer's to perform: the calls are still there to answer.
    assert [c.call_id for c in session.in_flight_calls()] == ["c-1"]


def test_shutdown_without_reason() -> None:
    actions = open_session().receive(Shutdown(id="s"))
    assert actions == [EndCalls(reason="shutdown", source="shutdown"), Close(code=1000)]


@pytest.mark.parametrize(
    "message",
    [
        Initialize(id="i2"),
        call("c-2"),
        CancelRequest(id="k", call_id="c-1"),
        Shutdown(id="s2"),
        ElicitationResponse(id="e"),
    ],
)
def test_messages_after_shutdown_are_ignored(message: Message) -> None:
    session = open_session()
    session.receive(Shutdown(id="s"))
    assert session.receive(message) == []
    assert session.disconnected() == []
    assert session.state is SessionState.CLOSED


@pytest.mark.parametrize(
    "text",
    ["{oops", frame("capabilities/call", {}, "late"), frame("capabilities/cancel", {}, "late")],
)
def test_undecodable_frames_after_shutdown_are_ignored(text: str) -> None:
    session = open_session()
    session.receive(Shutdown(id="s"))
    assert session.receive(refusal(text)) == []


def test_undecodable_frames_after_disconnect_are_ignored() -> None:
    session = open_session()
    session.disconnected()
    assert session.receive(refusal("{oops")) == []


def test_disconnect_when_open_ends_calls() -> None:
    session = open_session()
    start(session, "c-1")
    assert session.disconnected() == [EndCalls(reason="connection closed", source="disconnect")]
    assert session.state is SessionState.CLOSED
    assert session.receive(call("c-2")) == []
    assert session.disconnected() == []
    assert session.finish("c-1") is not None


def test_disconnect_before_initialize_does_nothing() -> None:
    session = new_session()
    assert session.disconnected() == []
    assert session.state is SessionState.CLOSED
    assert session.receive(Initialize(id="i")) == []


# -- random interleavings of the session table -------------------------------------------------

CALL_IDS = ["a", "b", "c"]


class SessionTable(RuleBasedStateMachine):
    """Calls, starts, cancels, finishes, shutdown and disconnect in any order.

    The model is what should be in flight: started and not yet answered. Answering is
    `finish`; a job answered twice is the bug this hunts for.
    """

    def __init__(self) -> None:
        super().__init__()
        self.session = new_session()
        self.session.receive(Initialize(id="init"))
        self.open = True
        self.model: dict[str, str] = {}  # call_id -> job_id
        self.answered: set[str] = set()
        self.job_numbers: Iterator[int] = itertools.count()
        self.request_numbers: Iterator[int] = itertools.count()

    def answer(self, call_id: str) -> None:
        got = self.session.finish(call_id)
        expected = self.model.pop(call_id, None)
        if expected is None:
            assert got is None
            return
        assert got is not None
        assert got.job_id == expected
        assert got.job_id not in self.answered, f"{got} answered twice"
        self.answered.add(got.job_id)

    def end_all(self) -> None:
        for in_flight in self.session.in_flight_calls():
            self.answer(in_flight.call_id)
        assert self.session.in_flight_calls() == []

    @rule(call_id=st.one_of(st.none(), st.sampled_from(CALL_IDS)), started=st.booleans())
    def send_call(self, call_id: str | None, started: bool) -> None:
        request_id = f"r-{next(self.request_numbers)}"
        actions = self.session.receive(call(call_id, message_id=request_id))
        if not self.open:
            assert actions == []
            return
        if call_id in self.model:
            reply = sent(actions)
            assert reply["id"] == request_id
            assert reply["payload"]["error"]["code"] == "INVALID_PARAMS"
            return
        [action] = actions
        assert isinstance(action, StartCall)
        assert action.request_id == request_id
        assert call_id is None or action.call_id == call_id
        assert action.call_id not in self.model
        if started:  # else the job could not be created and the consumer answered it
            job_id = f"job-{next(self.job_numbers)}"
            self.session.call_started(
                call_id=action.call_id, request_id=request_id, job_id=job_id, progress_token=None
            )
            self.model[action.call_id] = job_id

    @rule(call_id=st.sampled_from(CALL_IDS))
    def send_cancel(self, call_id: str) -> None:
        actions = self.session.receive(CancelRequest(id="k", call_id=call_id))
        if not self.open:
            assert actions == []
            return
        [action] = actions
        assert isinstance(action, CancelCall)
        assert action.in_flight == (call_id in self.model)
        if action.in_flight:
            self.answer(call_id)

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        # A result, timeout or worker death: any call id, in flight or not.
        self.answer(data.draw(st.sampled_from(sorted({*CALL_IDS, *self.model}))))

    @rule()
    def shutdown(self) -> None:
        actions = self.session.receive(Shutdown(id="s"))
        if not self.open:
            assert actions == []
            return
        assert actions == [EndCalls(reason="shutdown", source="shutdown"), Close(code=1000)]
        self.open = False
        self.end_all()

    @rule()
    def disconnect(self) -> None:
        actions = self.session.disconnected()
        if not self.open:
            assert actions == []
            return
        assert actions == [EndCalls(reason="connection closed", source="disconnect")]
        self.open = False
        self.end_all()

    @invariant()
    def in_flight_is_started_and_not_finished(self) -> None:
        table = {c.call_id: c.job_id for c in self.session.in_flight_calls()}
        assert table == self.model
        for call_id, job_id in self.model.items():
            in_flight = self.session.in_flight(call_id)
            assert in_flight is not None
            assert in_flight.job_id == job_id


SessionTable.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, database=None
)
TestSessionTable = SessionTable.TestCase


# -- limits and revocation -----------------------------------------------------------------


def limited_session(
    *, max_concurrent_calls: int | None = None, max_timeout_ms: int | None = None
) -> Session:
    session = Session(
        capability_names=lambda: list(NAMES),
        app=dict(APP),
        new_id=counter(),
        max_concurrent_calls=max_concurrent_calls,
        max_timeout_ms=None if max_timeout_ms is None else lambda _name: max_timeout_ms,
    )
    session.receive(Initialize(id="init", features=Features()))
    return session


def test_calls_beyond_the_concurrency_limit_are_rate_limited() -> None:
    session = limited_session(max_concurrent_calls=2)
    for n in (1, 2):
        [start] = session.receive(call(f"c{n}", message_id=f"r{n}"))
        assert isinstance(start, StartCall)
        session.call_started(
            call_id=f"c{n}", request_id=f"r{n}", job_id=f"j{n}", progress_token=None
        )
    error = sent(session.receive(call("c3", message_id="r3")))["payload"]["error"]
    assert error["code"] == "RATE_LIMITED"
    assert error["retryable"] is True
    assert error["details"] == {"limit": "concurrentCalls", "max": 2}
    session.finish("c1")
    assert isinstance(session.receive(call("c3", message_id="r4"))[0], StartCall)


def test_a_timeout_over_the_maximum_is_invalid_params() -> None:
    session = limited_session(max_timeout_ms=1000)
    assert isinstance(session.receive(call("ok", timeout_ms=1000))[0], StartCall)
    error = sent(session.receive(call("long", timeout_ms=1001)))["payload"]["error"]
    assert error["code"] == "INVALID_PARAMS"
    assert error["details"] == {"path": "payload.options.timeout", "max": 1000}


def test_the_timeout_maximum_is_the_capability_s_own() -> None:
    limits = {NAMES[0]: 1000, NAMES[1]: 5000}
    session = Session(
        capability_names=lambda: list(NAMES),
        app=dict(APP),
        new_id=counter(),
        max_timeout_ms=limits.__getitem__,
    )
    session.receive(Initialize(id="init", features=Features()))
    [start] = session.receive(call("slow", capability=NAMES[1], timeout_ms=5000))
    assert isinstance(start, StartCall)
    error = sent(session.receive(call("fast", capability=NAMES[0], timeout_ms=5000)))
    assert error["payload"]["error"]["details"]["max"] == 1000


def test_revoking_an_open_session_ends_its_calls_as_an_operator() -> None:
    session = open_session()
    assert session.revoked() == [EndCalls(reason="agent key revoked", source="operator")]
    assert session.state is SessionState.CLOSED
    assert session.revoked() == []
    assert new_session().revoked() == []


# -- resuming ---------------------------------------------------------------------------


def test_a_resumable_session_detaches_instead_of_cancelling() -> None:
    session = new_session(resumable=True)
    session.receive(Initialize(id="init"))
    start(session, "c1")
    assert session.disconnected() == [Detach()]
    assert session.in_flight_calls() == []  # the resuming connection answers them
    assert session.state is SessionState.CLOSED


def test_initialize_with_resume_asks_the_consumer_to_take_the_session() -> None:
    session = new_session(resumable=True)
    message = Initialize(id="r", resume=ResumeRequest(session_id="s-9", token="tok"))
    [action] = session.receive(message)
    assert action == ResumeSession(request_id="r", session_id="s-9", token="tok", message=message)
    assert session.state.value == "new"  # until the consumer reports back

    call = InFlight(call_id="c1", request_id="q1", job_id="j1", progress_token=None)
    reply = sent(session.resumed(action, token="token-new", calls=[call]))
    assert reply["id"] == "r"
    assert reply["payload"]["sessionId"] == "s-9"
    assert reply["payload"]["resumeToken"] == "token-new"
    assert session.state is SessionState.OPEN
    assert session.in_flight("c1") == call
    # A second initialize on this connection is refused as usual.
    again = sent(session.receive(Initialize(id="again")))["payload"]
    assert_error(again, "ALREADY_INITIALIZED")


def test_a_refused_resume_leaves_the_connection_free_to_initialize() -> None:
    session = new_session(resumable=True)
    message = Initialize(id="r", resume=ResumeRequest(session_id="s-9", token="bad"))
    [action] = session.receive(message)
    assert isinstance(action, ResumeSession)
    error = WireError(code=ErrorCode.SESSION_EXPIRED, message="too late")
    reply = sent(session.resume_refused(action, error))
    assert reply["id"] == "r"
    assert_error(reply["payload"], "SESSION_EXPIRED")
    assert session.state is SessionState.NEW
    assert isinstance(session.receive(Initialize(id="fresh"))[0], OpenSession)
