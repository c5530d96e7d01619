"""The wire format: decode every message type, reject every bad frame with a code, encode."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    MessageType,
    ProtocolError,
    ResumeRequest,
    Shutdown,
    WireError,
    decode,
    encode,
)
from capabilities.protocol.codec import _DECODERS, MAX_AWAITING, MAX_ID_LENGTH
from capabilities.protocol.errors import RETRYABLE_CODES
from capabilities.protocol.fields import FieldError, Fields
from capabilities.protocol.text import unstorable

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def frame(
    message_type: Any = "shutdown",
    payload: Any = None,
    *,
    message_id: Any = "r1",
    **extra: Any,
) -> str:
    """An envelope as an agent would send it; `...` leaves a field out."""
    raw: dict[str, Any] = {"type": message_type, "id": message_id, "timestamp": 1_700_000_000_000}
    if payload is not None:
        raw["payload"] = payload
    raw.update(extra)
    return json.dumps({key: value for key, value in raw.items() if value is not ...})


def rejected(text: str | bytes) -> ProtocolError:
    """Decode a frame that must be refused, and return the refusal."""
    with pytest.raises(ProtocolError) as caught:
        decode(text)
    return caught.value


def call_frame(payload: dict[str, Any]) -> str:
    return frame("capabilities/call", {"capability": "export.pdf", **payload})


# -- initialize ------------------------------------------------------------------------


def test_initialize_full() -> None:
    message = decode(
        frame(
            "initialize",
            {
                "agent": {"name": "claude", "version": "1.2"},
                "protocolVersion": "0.1",
                "features": {"notifications": True, "progress": True, "elicitation": False},
                "resume": {"sessionId": "s-1", "token": "t-1"},
            },
            message_id="init-1",
        )
    )
    assert message == Initialize(
        id="init-1",
        agent=AgentInfo(name="claude", version="1.2"),
        protocol_version="0.1",
        features=Features(notifications=True, progress=True, elicitation=False),
        resume=ResumeRequest(session_id="s-1", token="t-1"),
    )


@pytest.mark.parametrize("payload", [None, {}, {"resume": None, "features": None, "agent": None}])
def test_initialize_minimal(payload: dict[str, Any] | None) -> None:
    message = decode(frame("initialize", payload))
    assert message == Initialize(id="r1")
    assert message.protocol_version == "0.1"
    assert message.features == Features()
    assert message.resume is None


def test_initialize_payload_null_is_an_empty_payload() -> None:
    assert decode(json.dumps({"type": "initialize", "id": "r1", "payload": None})) == Initialize(
        id="r1"
    )


@pytest.mark.parametrize(
    ("payload", "code", "path"),
    [
        ({"agent": "claude"}, ErrorCode.INVALID_TYPE, "payload.agent"),
        ({"agent": {"name": 3}}, ErrorCode.INVALID_TYPE, "payload.agent.name"),
        ({"features": []}, ErrorCode.INVALID_TYPE, "payload.features"),
        ({"features": {"progress": "yes"}}, ErrorCode.INVALID_TYPE, "payload.features.progress"),
        (
            {"features": {"notifications": 1}},
            ErrorCode.INVALID_TYPE,
            "payload.features.notifications",
        ),
        ({"protocolVersion": 0.1}, ErrorCode.INVALID_TYPE, "payload.protocolVersion"),
        ({"resume": "s-1"}, ErrorCode.INVALID_TYPE, "payload.resume"),
        ({"resume": {}}, ErrorCode.MISSING_PARAM, "payload.resume.sessionId"),
        ({"resume": {"sessionId": "s"}}, ErrorCode.MISSING_PARAM, "payload.resume.token"),
        (
            {"resume": {"sessionId": 1, "token": "t"}},
            ErrorCode.INVALID_TYPE,
            "payload.resume.sessionId",
        ),
        # Text no store can hold (PostgreSQL refuses NUL; UTF-8 has no lone surrogate).
        ({"agent": {"name": "a\x00b"}}, ErrorCode.INVALID_PARAMS, "payload.agent.name"),
        ({"agent": {"version": "\ud800"}}, ErrorCode.INVALID_PARAMS, "payload.agent.version"),
        (
            {"resume": {"sessionId": "s", "token": "t\x00"}},
            ErrorCode.INVALID_PARAMS,
            "payload.resume.token",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": "c-1"}},
            ErrorCode.INVALID_TYPE,
            "payload.resume.awaiting",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": ["c-1", 2]}},
            ErrorCode.INVALID_TYPE,
            "payload.resume.awaiting[1]",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": [""]}},
            ErrorCode.INVALID_PARAMS,
            "payload.resume.awaiting[0]",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": ["x" * (MAX_ID_LENGTH + 1)]}},
            ErrorCode.INVALID_PARAMS,
            "payload.resume.awaiting[0]",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": ["a\x00"]}},
            ErrorCode.INVALID_PARAMS,
            "payload.resume.awaiting[0]",
        ),
        (
            {"resume": {"sessionId": "s", "token": "t", "awaiting": ["c"] * (MAX_AWAITING + 1)}},
            ErrorCode.INVALID_PARAMS,
            "payload.resume.awaiting",
        ),
    ],
)
def test_initialize_rejections(payload: dict[str, Any], code: ErrorCode, path: str) -> None:
    error = rejected(frame("initialize", payload, message_id="i-9"))
    assert error.code == code
    assert error.error.details == {"path": path}
    assert (error.request_id, error.request_type) == ("i-9", "initialize")


def test_a_resume_names_the_calls_the_agent_awaits_once_each_in_order() -> None:
    resume = {"sessionId": "s-1", "token": "t-1", "awaiting": ["c-2", "c-1", "c-2"]}
    message = decode(frame("initialize", {"resume": resume}))
    assert isinstance(message, Initialize)
    assert message.resume == ResumeRequest(session_id="s-1", token="t-1", awaiting=("c-2", "c-1"))


def test_a_call_sent_again_after_a_resume_says_so() -> None:
    message = decode(call_frame({"options": {"callId": "c-1", "resent": True}}))
    assert isinstance(message, CallRequest)
    assert message.options == CallOptions(call_id="c-1", resent=True)
    refused = rejected(call_frame({"options": {"callId": "c-1", "resent": "yes"}}))
    assert refused.error.details == {"path": "payload.options.resent"}


# -- capabilities/call ---------------------------------------------------------------------


def test_call_full_with_call_id_in_options() -> None:
    message = decode(
        frame(
            "capabilities/call",
            {
                "capability": "export.pdf",
                "params": {"html": "<p>hi</p>", "options": {"landscape": True}},
                "options": {"timeout": 30000, "progressToken": "tok", "callId": "c-1"},
            },
            message_id="req-7",
        )
    )
    assert message == CallRequest(
        id="req-7",
        capability="export.pdf",
        params={"html": "<p>hi</p>", "options": {"landscape": True}},
        options=CallOptions(timeout_ms=30000, progress_token="tok", call_id="c-1"),
    )


def test_call_minimal() -> None:
    message = decode(frame("capabilities/call", {"capability": "convert.markdownToHtml"}))
    assert message == CallRequest(id="r1", capability="convert.markdownToHtml")
    assert message.params == {}
    assert message.options == CallOptions()


def test_call_null_params_and_options_are_empty() -> None:
    message = decode(call_frame({"params": None, "options": None}))
    assert isinstance(message, CallRequest)
    assert message.params == {}
    assert message.options == CallOptions()


def test_call_id_at_the_top_of_the_payload() -> None:
    message = decode(call_frame({"callId": "top"}))
    assert isinstance(message, CallRequest)
    assert message.options.call_id == "top"


def test_call_id_in_options_wins_over_the_top_of_the_payload() -> None:
    message = decode(call_frame({"callId": "top", "options": {"callId": "opt"}}))
    assert isinstance(message, CallRequest)
    assert message.options.call_id == "opt"


def test_call_id_null_in_options_falls_back_to_the_top() -> None:
    message = decode(call_frame({"callId": "top", "options": {"callId": None}}))
    assert isinstance(message, CallRequest)
    assert message.options.call_id == "top"


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [(1, 1), (30000, 30000), (1500.9, 1500), (0.25, 1), (1e3, 1000), (10**15, 10**15)],
)
def test_call_timeout_int_or_float(timeout: float, expected: int) -> None:
    message = decode(call_frame({"options": {"timeout": timeout}}))
    assert isinstance(message, CallRequest)
    assert message.options.timeout_ms == expected
    assert type(message.options.timeout_ms) is int


@pytest.mark.parametrize("token", ["op-1", "", 7, 0, -3])
def test_call_progress_token_string_or_int(token: str | int) -> None:
    message = decode(call_frame({"options": {"progressToken": token}}))
    assert isinstance(message, CallRequest)
    assert message.options.progress_token == token
    assert type(message.options.progress_token) is type(token)


@pytest.mark.parametrize(
    ("payload", "code", "path"),
    [
        ({"capability": None}, ErrorCode.MISSING_PARAM, "payload.capability"),
        ({"capability": 12}, ErrorCode.INVALID_TYPE, "payload.capability"),
        ({"capability": ["export.pdf"]}, ErrorCode.INVALID_TYPE, "payload.capability"),
        ({"params": []}, ErrorCode.INVALID_TYPE, "payload.params"),
        ({"params": "html"}, ErrorCode.INVALID_TYPE, "payload.params"),
        ({"options": 5}, ErrorCode.INVALID_TYPE, "payload.options"),
        ({"options": {"timeout": -1}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": -0.5}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": 0}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": 0.0}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": "1000"}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": "NaN"}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": "Infinity"}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": True}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": [1]}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        ({"options": {"timeout": 10**400}}, ErrorCode.INVALID_TYPE, "payload.options.timeout"),
        (
            {"options": {"progressToken": True}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        (
            {"options": {"progressToken": False}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        (
            {"options": {"progressToken": 1.5}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        (
            {"options": {"progressToken": {}}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        (
            {"options": {"progressToken": "x" * 201}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        ({"options": {"callId": ""}}, ErrorCode.INVALID_PARAMS, "payload.options.callId"),
        ({"options": {"callId": "c" * 201}}, ErrorCode.INVALID_PARAMS, "payload.options.callId"),
        ({"options": {"callId": 5}}, ErrorCode.INVALID_TYPE, "payload.options.callId"),
        ({"callId": ""}, ErrorCode.INVALID_PARAMS, "payload.callId"),
        ({"callId": "c" * 201}, ErrorCode.INVALID_PARAMS, "payload.callId"),
        ({"callId": 5}, ErrorCode.INVALID_TYPE, "payload.callId"),
        ({"callId": {"id": "c"}}, ErrorCode.INVALID_TYPE, "payload.callId"),
        ({"options": {"callId": "a\x00"}}, ErrorCode.INVALID_PARAMS, "payload.options.callId"),
        ({"callId": "\udc00"}, ErrorCode.INVALID_PARAMS, "payload.callId"),
        (
            {"options": {"progressToken": "p\x00"}},
            ErrorCode.INVALID_TYPE,
            "payload.options.progressToken",
        ),
        ({"capability": "export.pdf\x00"}, ErrorCode.INVALID_PARAMS, "payload.capability"),
    ],
)
def test_call_rejections(payload: dict[str, Any], code: ErrorCode, path: str) -> None:
    error = rejected(call_frame(payload))
    assert error.code == code
    assert error.error.details == {"path": path}
    assert (error.request_id, error.request_type) == ("r1", "capabilities/call")


def test_call_without_capability_is_missing_param() -> None:
    error = rejected(frame("capabilities/call", {"params": {}}))
    assert error.code == ErrorCode.MISSING_PARAM
    assert error.error.details == {"path": "payload.capability"}


def test_an_id_with_a_nul_is_not_read() -> None:
    error = rejected(json.dumps({"type": "shutdown", "id": "a\x00b"}))
    assert error.code == ErrorCode.PARSE_ERROR
    assert error.request_id is None


def test_call_id_at_the_limits() -> None:
    message = decode(call_frame({"options": {"callId": "c" * MAX_ID_LENGTH}}))
    assert isinstance(message, CallRequest)
    assert message.options.call_id == "c" * MAX_ID_LENGTH
    message = decode(call_frame({"callId": "c"}))
    assert isinstance(message, CallRequest)
    assert message.options.call_id == "c"


# -- capabilities/cancel, shutdown, elicitation/response -------------------------------------


def test_cancel_with_reason() -> None:
    message = decode(frame("capabilities/cancel", {"callId": "c-1", "reason": "user asked"}))
    assert message == CancelRequest(id="r1", call_id="c-1", reason="user asked")


def test_cancel_without_reason() -> None:
    assert decode(frame("capabilities/cancel", {"callId": "c-1"})) == CancelRequest(
        id="r1", call_id="c-1"
    )


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (None, ErrorCode.MISSING_PARAM),
        ({}, ErrorCode.MISSING_PARAM),
        ({"callId": None}, ErrorCode.MISSING_PARAM),
        ({"callId": ""}, ErrorCode.INVALID_PARAMS),
        ({"callId": "c" * 201}, ErrorCode.INVALID_PARAMS),
        ({"callId": 4}, ErrorCode.INVALID_TYPE),
    ],
)
def test_cancel_rejections(payload: dict[str, Any] | None, code: ErrorCode) -> None:
    error = rejected(frame("capabilities/cancel", payload, message_id="x"))
    assert error.code == code
    assert error.error.details == {"path": "payload.callId"}
    assert (error.request_id, error.request_type) == ("x", "capabilities/cancel")


def test_cancel_reason_must_be_a_string() -> None:
    error = rejected(frame("capabilities/cancel", {"callId": "c", "reason": 1}))
    assert error.code == ErrorCode.INVALID_TYPE
    assert error.error.details == {"path": "payload.reason"}


def test_shutdown_with_and_without_reason() -> None:
    assert decode(frame("shutdown", {"reason": "done"})) == Shutdown(id="r1", reason="done")
    assert decode(frame("shutdown")) == Shutdown(id="r1")
    assert rejected(frame("shutdown", {"reason": False})).code == ErrorCode.INVALID_TYPE


def test_elicitation_response_keeps_its_payload() -> None:
    payload = {"requestId": "e-1", "action": "accept", "content": {"x": [1, None]}}
    assert decode(frame("elicitation/response", payload)) == ElicitationResponse(
        id="r1", payload=payload
    )
    assert decode(frame("elicitation/response")) == ElicitationResponse(id="r1")


# -- the envelope ------------------------------------------------------------------------------


def test_timestamp_missing_is_tolerated() -> None:
    assert decode(frame("shutdown", timestamp=...)) == Shutdown(id="r1")
    assert decode(frame("shutdown", timestamp=None)) == Shutdown(id="r1")
    assert decode(frame("shutdown", timestamp=1.5)) == Shutdown(id="r1")


@pytest.mark.parametrize("timestamp", ["1700000000000", True, [], {}, 10**400])
def test_timestamp_of_the_wrong_type(timestamp: Any) -> None:
    error = rejected(frame("shutdown", message_id="t", timestamp=timestamp))
    assert error.code == ErrorCode.INVALID_TYPE
    assert error.error.details == {"path": "timestamp"}
    assert (error.request_id, error.request_type) == ("t", "shutdown")


@pytest.mark.parametrize(("raw_id", "expected"), [(42, "42"), (0, "0"), (-7, "-7")])
def test_numeric_ids_become_strings(raw_id: int, expected: str) -> None:
    message = decode(frame("shutdown", message_id=raw_id))
    assert message.id == expected
    error = rejected(frame("nope", message_id=raw_id))
    assert error.request_id == expected


def test_bytes_frames_are_decoded() -> None:
    assert decode(frame("shutdown").encode()) == Shutdown(id="r1")
    assert decode(frame("shutdown", {"reason": "é✓"}).encode("utf-8")) == Shutdown(
        id="r1", reason="é✓"
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "not json",
        "{",
        '{"type": "shutdown", "id": "r1"',
        "{'type': 'shutdown'}",
        "\ufeff" + '{"type": "shutdown", "id": "r1"}',
        b"\xff\xfe\xfa",
        b'{"type": "shutdown", "id": "\xc3"}',
        b"\x80abc",
        '{"type": "capabilities/call", "id": "r1", "payload": {"options": {"timeout": NaN}}}',
        '{"type": "capabilities/call", "id": "r1", "payload": {"options": {"timeout": Infinity}}}',
        '{"type": "shutdown", "id": "r1", "timestamp": -Infinity}',
        "NaN",
        "[" * 100_000,
        '{"id": ' + "9" * 5000 + "}",
    ],
)
def test_unparsable_frames(text: str | bytes) -> None:
    error = rejected(text)
    assert error.code == ErrorCode.PARSE_ERROR
    assert error.request_id is None
    assert error.request_type is None
    assert error.error.message == "Frame is not valid JSON."


@pytest.mark.parametrize(
    "text", ["[]", '[{"type": "shutdown", "id": "r1"}]', '"shutdown"', "42", "1.5", "null", "true"]
)
def test_frames_that_are_not_objects(text: str) -> None:
    error = rejected(text)
    assert error.code == ErrorCode.PARSE_ERROR
    assert (error.request_id, error.request_type) == (None, None)


@pytest.mark.parametrize("message_type", [..., None, 5, True, ["shutdown"], {"t": 1}])
def test_type_missing_or_not_a_string(message_type: Any) -> None:
    error = rejected(frame(message_type, message_id="keep-me"))
    assert error.code == ErrorCode.PARSE_ERROR
    assert error.request_id == "keep-me"
    assert error.request_type is None


@pytest.mark.parametrize(
    "message_id", [..., None, "", "i" * (MAX_ID_LENGTH + 1), True, False, 1.5, [], {}]
)
def test_id_missing_empty_too_long_or_of_the_wrong_type(message_id: Any) -> None:
    error = rejected(frame("capabilities/cancel", {"callId": "c"}, message_id=message_id))
    assert error.code == ErrorCode.PARSE_ERROR
    assert error.request_id is None
    assert error.request_type == "capabilities/cancel"


def test_id_at_the_length_limit() -> None:
    assert decode(frame("shutdown", message_id="i" * MAX_ID_LENGTH)).id == "i" * MAX_ID_LENGTH


def test_numeric_id_longer_than_the_limit_is_refused() -> None:
    # A string id over MAX_ID_LENGTH is refused; the same id as a number must be too,
    # or a 4,000-digit id gets echoed in every reply (progressToken has the same cap).
    error = rejected(frame("shutdown", message_id=10 ** (MAX_ID_LENGTH + 50)))
    assert error.code == ErrorCode.PARSE_ERROR
    assert error.request_type == "shutdown"


@pytest.mark.parametrize("payload", [[], "x", 3, True, [{"capability": "export.pdf"}]])
def test_payload_not_an_object(payload: Any) -> None:
    error = rejected(frame("capabilities/call", payload, message_id="p"))
    assert error.code == ErrorCode.INVALID_TYPE
    assert error.error.details == {"path": "payload"}
    assert (error.request_id, error.request_type) == ("p", "capabilities/call")


@pytest.mark.parametrize(
    "message_type",
    [
        "",
        "ping",
        "Initialize",
        "capabilities/call-result",
        "initialize-result",
        "notification",
        "x" * 500,
    ],
)
def test_unknown_message_type(message_type: str) -> None:
    error = rejected(frame(message_type, {}, message_id="u"))
    assert error.code == ErrorCode.UNKNOWN_MESSAGE_TYPE
    assert (error.request_id, error.request_type) == ("u", message_type)
    assert len(error.error.message) < 120


def test_protocol_error_code_and_message() -> None:
    error = rejected(frame("capabilities/call", {}))
    assert isinstance(error.code, ErrorCode)
    assert str(error) == error.error.message == "'payload.capability' is required."
    assert error.error.to_json() == {
        "code": "MISSING_PARAM",
        "message": "'payload.capability' is required.",
        "retryable": False,
        "details": {"path": "payload.capability"},
    }


def test_json_error_text_never_reaches_the_message() -> None:
    error = rejected('{"type": "shutdown", "id": "secret-token-abc"')
    assert "secret" not in error.error.message
    assert error.__cause__ is not None


# -- encode ------------------------------------------------------------------------------------


def test_encode_envelope() -> None:
    before = time.time_ns() // 1_000_000
    text = encode(MessageType.CANCEL_RESULT, {"callId": "c", "cancelled": True}, message_id="m-1")
    after = time.time_ns() // 1_000_000
    envelope = json.loads(text)
    assert list(envelope) == ["type", "id", "timestamp", "payload"]
    assert envelope["type"] == "capabilities/cancel-result"
    assert envelope["id"] == "m-1"
    assert type(envelope["timestamp"]) is int
    assert before <= envelope["timestamp"] <= after
    assert envelope["payload"] == {"callId": "c", "cancelled": True}


def test_encode_is_compact_and_keeps_unicode() -> None:
    text = encode("notification", {"event": "é", "data": {"a": [1, 2]}}, message_id="m")
    assert ": " not in text
    assert ", " not in text
    assert '"event":"é"' in text
    assert re.search(r'"type":"notification"', text)


def test_encode_gives_a_fresh_id_when_none_is_given() -> None:
    first = json.loads(encode(MessageType.PROGRESS, {}))
    second = json.loads(encode(MessageType.PROGRESS, {}))
    assert first["id"] != second["id"]
    assert str(uuid.UUID(first["id"])) == first["id"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_encode_refuses_non_finite_numbers(value: float) -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        encode(MessageType.PROGRESS, {"progress": value}, message_id="m")


def test_encoded_requests_decode_back() -> None:
    text = encode(MessageType.CANCEL, {"callId": "c-2", "reason": "r"}, message_id="x-1")
    assert decode(text) == CancelRequest(id="x-1", call_id="c-2", reason="r")


# -- WireError ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(ErrorCode))
def test_wire_error_retryable_defaults_from_the_code(code: ErrorCode) -> None:
    data = WireError(code=code, message="m").to_json()
    assert data == {"code": code.value, "message": "m", "retryable": code in RETRYABLE_CODES}


def test_retryable_codes() -> None:
    assert ErrorCode.WORKER_LOST in RETRYABLE_CODES
    assert ErrorCode.RATE_LIMITED in RETRYABLE_CODES
    assert ErrorCode.CANCELLED not in RETRYABLE_CODES
    assert ErrorCode.INVALID_PARAMS not in RETRYABLE_CODES
    assert WireError(code="TIMEOUT", message="m").to_json()["retryable"] is True


def test_wire_error_explicit_retryable_wins() -> None:
    assert (
        WireError(code=ErrorCode.TIMEOUT, message="m", retryable=False).to_json()["retryable"]
        is False
    )
    assert (
        WireError(code=ErrorCode.CANCELLED, message="m", retryable=True).to_json()["retryable"]
        is True
    )


def test_wire_error_optional_fields_only_when_set() -> None:
    full = WireError(
        code=ErrorCode.RATE_LIMITED, message="slow down", retry_after_ms=0, details={"n": 1}
    ).to_json()
    assert full == {
        "code": "RATE_LIMITED",
        "message": "slow down",
        "retryable": True,
        "retryAfter": 0,
        "details": {"n": 1},
    }
    bare = WireError(code=ErrorCode.RATE_LIMITED, message="m").to_json()
    assert "retryAfter" not in bare
    assert "details" not in bare
    assert json.loads(json.dumps(full)) == full


# -- Fields: the one typed field reader (the codec's, and the runners') ---------------------


def field_error(read: Any) -> tuple[ErrorCode, str, str]:
    with pytest.raises(FieldError) as caught:
        read()
    return caught.value.code, caught.value.path, caught.value.message


def test_fields_read_null_as_absent() -> None:
    fields = Fields({"a": None}, "params")
    assert fields.optional_integer("a") is None
    assert fields.integer("a", 7) == 7
    assert fields.boolean("a", True) is True
    assert fields.object("a").data == {}
    assert fields.objects("a") == []
    assert field_error(lambda: fields.string("a")) == (
        ErrorCode.MISSING_PARAM,
        "params.a",
        "'params.a' is required.",
    )


def test_fields_read_integers_as_json_schema_does() -> None:
    fields = Fields({"whole": 3.0, "half": 3.5, "flag": True}, "params")
    assert fields.integer("whole") == 3
    assert type(fields.integer("whole")) is int
    assert field_error(lambda: fields.integer("half"))[:2] == (
        ErrorCode.INVALID_TYPE,
        "params.half",
    )
    assert field_error(lambda: fields.integer("flag"))[:2] == (
        ErrorCode.INVALID_TYPE,
        "params.flag",
    )
    assert field_error(lambda: fields.number("flag"))[:2] == (ErrorCode.INVALID_TYPE, "params.flag")
    assert type(Fields({"n": 2}, "p").number("n")) is float


def test_fields_name_array_items_and_choices() -> None:
    fields = Fields({"items": [{}, {"kind": "x"}, 5]}, "params")
    assert field_error(lambda: fields.objects("items")) == (
        ErrorCode.INVALID_TYPE,
        "params.items[2]",
        "'params.items[2]' must be an object.",
    )
    first, second = Fields({"items": [{}, {"kind": "x"}]}, "params").objects("items")
    assert first.choice("kind", MessageType, MessageType.CALL) is MessageType.CALL
    assert field_error(lambda: second.choice("kind", MessageType))[:2] == (
        ErrorCode.INVALID_PARAMS,
        "params.items[1].kind",
    )


def test_only_text_is_checked_for_what_no_store_can_hold() -> None:
    # Runners read strings the registry already checked, some megabytes long.
    fields = Fields({"s": "a\x00"}, "payload")
    assert fields.string("s") == "a\x00"
    assert field_error(lambda: fields.text("s")) == (
        ErrorCode.INVALID_PARAMS,
        "payload.s",
        "'payload.s' must not contain a NUL character.",
    )


# -- fuzzing: decode raises ProtocolError with a known code, or returns a message ---------------

MESSAGE_CLASSES = (
    Initialize,
    CallRequest,
    CancelRequest,
    Shutdown,
    ElicitationResponse,
    ListCapabilities,
)
TYPE_OF: dict[type, MessageType] = {
    Initialize: MessageType.INITIALIZE,
    CallRequest: MessageType.CALL,
    CancelRequest: MessageType.CANCEL,
    Shutdown: MessageType.SHUTDOWN,
    ElicitationResponse: MessageType.ELICITATION_RESPONSE,
    ListCapabilities: MessageType.LIST,
}
CODES = set(ErrorCode)


def decode_or_refuse(text: str | bytes) -> Message | ProtocolError:
    """Decode; anything raised but a ProtocolError fails the test."""
    try:
        message = decode(text)
    except ProtocolError as error:
        outcome: Message | ProtocolError = error
    else:
        outcome = message
    if isinstance(outcome, ProtocolError):
        assert outcome.code in CODES
        assert isinstance(outcome.error.code, ErrorCode)
        assert outcome.request_id is None or isinstance(outcome.request_id, str)
        assert outcome.request_id != ""
        assert outcome.request_type is None or isinstance(outcome.request_type, str)
        json.dumps(outcome.error.to_json(), allow_nan=False)
    else:
        assert isinstance(outcome, MESSAGE_CLASSES)
        assert isinstance(outcome.id, str)
        assert outcome.id
    return outcome


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=25,
)

KNOWN_KEYS = [
    "agent",
    "name",
    "version",
    "features",
    "notifications",
    "progress",
    "elicitation",
    "protocolVersion",
    "resume",
    "sessionId",
    "token",
    "capability",
    "params",
    "options",
    "timeout",
    "progressToken",
    "callId",
    "reason",
]
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8))
field_values = st.one_of(
    json_scalars,
    st.sampled_from(["export.pdf", "c-1", "", "x" * 201, 0, -1, 0.5, 10**400, True]),
)
nested_values = st.recursive(
    field_values,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(keys, children, max_size=6),
    ),
    max_leaves=12,
)
payloads = st.dictionaries(keys, nested_values, max_size=5)
ids = st.one_of(
    st.text(min_size=1, max_size=MAX_ID_LENGTH),
    st.integers(min_value=-(10**50), max_value=10**50),
    json_scalars,
)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_bytes(data: bytes) -> None:
    decode_or_refuse(data)


@FUZZ
@given(st.text(max_size=300))
def test_fuzz_text(text: str) -> None:
    decode_or_refuse(text)


@FUZZ
@given(json_values)
def test_fuzz_json_values(value: Any) -> None:
    decode_or_refuse(json.dumps(value))


def expected_id(message_id: Any) -> str | None:
    if isinstance(message_id, str) and 0 < len(message_id) <= MAX_ID_LENGTH:
        return None if unstorable(message_id) else message_id
    if isinstance(message_id, int) and not isinstance(message_id, bool):
        return str(message_id) if len(str(message_id)) <= MAX_ID_LENGTH else None
    return None


@FUZZ
@given(
    st.sampled_from(sorted(_DECODERS)),
    ids,
    st.one_of(payloads, json_values),
    st.one_of(
        st.none(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    ),
)
def test_fuzz_envelopes(message_type: str, message_id: Any, payload: Any, timestamp: Any) -> None:
    text = json.dumps(
        {"type": message_type, "id": message_id, "timestamp": timestamp, "payload": payload}
    )
    outcome = decode_or_refuse(text)
    again = decode_or_refuse(text.encode("utf-8"))
    if isinstance(outcome, ProtocolError):
        assert isinstance(again, ProtocolError)
        assert again.code == outcome.code
    else:
        assert again == outcome
    if isinstance(outcome, ProtocolError):
        assert (outcome.request_id, outcome.request_type) == (expected_id(message_id), message_type)
    else:
        assert outcome.id == expected_id(message_id)
        assert TYPE_OF[type(outcome)] == message_type
