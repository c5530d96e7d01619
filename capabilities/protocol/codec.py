"""Decode frames into typed messages and encode replies.

`decode` never raises anything but `ProtocolError`, whatever the input: every
rejection has a code, and carries the envelope's id and type when they could be read.
The readers public here serve JSON-RPC's codec too: a field reads the same on both
wires, under the name of the object it sits in (`payload.callId`, `params.callId`).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from capabilities.protocol.errors import ErrorCode, ProtocolError
from capabilities.protocol.fields import FieldError, Fields
from capabilities.protocol.messages import (
    JSON,
    AgentInfo,
    CallOptions,
    CallRequest,
    CancelRequest,
    ElicitationResponse,
    Features,
    Initialize,
    ListCapabilities,
    Message,
    MessageType,
    RequestId,
    ResumeRequest,
    Shutdown,
)
from capabilities.protocol.text import unstorable

MAX_ID_LENGTH = 200
# A session's calls in flight are bounded by its principal's (2,000 by default).
MAX_AWAITING = 10_000

Decoder = Callable[[RequestId, Fields], Message]
"""Reads one request's payload (ABP) or params (JSON-RPC) into its message."""


def now_ms() -> int:
    """Unix time in milliseconds, the envelope's `timestamp`."""
    return time.time_ns() // 1_000_000


def encode(
    message_type: str, payload: dict[str, Any], *, message_id: RequestId | None = None
) -> str:
    """Serialize an outgoing envelope; a missing id gets a fresh UUID."""
    envelope = {
        "type": str(message_type),
        "id": message_id if message_id is not None else str(uuid.uuid4()),
        "timestamp": now_ms(),
        "payload": payload,
    }
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode(text: str | bytes) -> Message:
    """Parse one frame into a typed message, or raise ProtocolError with a code."""
    raw = parse_frame(text)
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.PARSE_ERROR, "Frame must be a JSON object (an envelope).")
    return _decode_envelope(raw)


def parse_frame(text: str | bytes) -> JSON:
    """One frame's JSON value; NaN and Infinity are not JSON."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError) as exc:
        # Only the class goes on the wire: JSON error texts may quote the input.
        raise ProtocolError(ErrorCode.PARSE_ERROR, "Frame is not valid JSON.") from exc


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


@contextmanager
def refusing_bad_fields(request_id: RequestId, request_type: str) -> Iterator[None]:
    """Turn a FieldError raised within into the ProtocolError refusing this request."""
    try:
        yield
    except FieldError as error:
        raise ProtocolError(
            error.code,
            error.message,
            request_id=request_id,
            request_type=request_type,
            details={"path": error.path},
        ) from None


def body_of(value: JSON, path: str, code: ErrorCode) -> Fields:
    """A request's payload or params: an object; absent or null reads as empty."""
    if value is None:
        return Fields({}, path)
    if not isinstance(value, dict):
        raise FieldError(code, f"'{path}' must be an object.", path)
    return Fields(value, path)


def _decode_envelope(raw: dict[str, JSON]) -> Message:
    message_type = raw.get("type")
    message_id = raw.get("id")
    readable_type = message_type if isinstance(message_type, str) else None
    readable_id = _readable_id(message_id)
    if readable_type is None:
        raise ProtocolError(
            ErrorCode.PARSE_ERROR, "Envelope needs a string 'type'.", request_id=readable_id
        )
    if readable_id is None:
        raise ProtocolError(
            ErrorCode.PARSE_ERROR,
            "Envelope needs an 'id': a non-empty string (no NUL, no lone surrogate) or a number.",
            request_type=readable_type,
        )
    with refusing_bad_fields(readable_id, readable_type):
        timestamp = raw.get("timestamp")
        if timestamp is not None and not _is_number(timestamp):
            message = "'timestamp' must be a number (Unix ms)."
            raise FieldError(ErrorCode.INVALID_TYPE, message, "timestamp")
        payload = body_of(raw.get("payload"), "payload", ErrorCode.INVALID_TYPE)
        decoder = _DECODERS.get(readable_type)
        if decoder is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_MESSAGE_TYPE,
                f"Unknown message type {readable_type[:80]!r}.",
                request_id=readable_id,
                request_type=readable_type,
            )
        return decoder(readable_id, payload)


def _readable_id(value: JSON) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and not unstorable(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
        return text if len(text) <= MAX_ID_LENGTH else None
    return None


def _is_number(value: JSON) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def call_id_of(fields: Fields, key: str) -> str | None:
    """An optional callId: 1 to MAX_ID_LENGTH storable characters."""
    value = fields.optional_text(key)
    if value is not None and not 0 < len(value) <= MAX_ID_LENGTH:
        where = fields.where(key)
        message = f"'{where}' must be 1 to {MAX_ID_LENGTH} characters."
        raise FieldError(ErrorCode.INVALID_PARAMS, message, where)
    return value


def call_ids_of(fields: Fields, key: str) -> tuple[str, ...]:
    """An optional array of callIds: at most MAX_AWAITING, each as `call_id_of` reads one."""
    values = fields.texts(key)
    where = fields.where(key)
    if len(values) > MAX_AWAITING:
        message = f"'{where}' must have at most {MAX_AWAITING} callIds."
        raise FieldError(ErrorCode.INVALID_PARAMS, message, where)
    for index, value in enumerate(values):
        if not 0 < len(value) <= MAX_ID_LENGTH:
            message = f"'{where}[{index}]' must be 1 to {MAX_ID_LENGTH} characters."
            raise FieldError(ErrorCode.INVALID_PARAMS, message, f"{where}[{index}]")
    return tuple(dict.fromkeys(values))


def resume_request_of(fields: Fields) -> ResumeRequest:
    """`resume: {sessionId, token, awaiting?}`, in either dialect."""
    return ResumeRequest(
        session_id=fields.text("sessionId"),
        token=fields.text("token"),
        awaiting=call_ids_of(fields, "awaiting"),
    )


def agent_info_of(fields: Fields) -> AgentInfo:
    """Who connects: `{name?, version?}`, ABP's `agent` or JSON-RPC's `clientInfo`."""
    return AgentInfo(
        name=fields.optional_text("name") or "", version=fields.optional_text("version") or ""
    )


def _decode_initialize(message_id: RequestId, payload: Fields) -> Message:
    agent = payload.object("agent")
    features = payload.object("features")
    resume = None
    if payload.get("resume") is not None:
        resume = resume_request_of(payload.object("resume"))
    return Initialize(
        id=message_id,
        agent=agent_info_of(agent),
        protocol_version=payload.optional_text("protocolVersion") or "0.1",
        features=Features(
            notifications=features.boolean("notifications", False),
            progress=features.boolean("progress", False),
            elicitation=features.boolean("elicitation", False),
        ),
        resume=resume,
    )


def timeout_ms_of(fields: Fields, key: str) -> int | None:
    """An optional timeout: a positive number of milliseconds."""
    timeout = fields.get(key)
    if timeout is None:
        return None
    if not _is_number(timeout) or timeout <= 0:
        where = fields.where(key)
        message = f"'{where}' must be a positive number of milliseconds."
        raise FieldError(ErrorCode.INVALID_TYPE, message, where)
    return max(1, int(timeout))


def progress_token_of(fields: Fields, key: str) -> str | int | None:
    """An optional progressToken: a storable string or an integer."""
    token = fields.get(key)
    if token is not None and (
        isinstance(token, bool)
        or not isinstance(token, str | int)
        or len(str(token)) > 200
        or (isinstance(token, str) and unstorable(token))
    ):
        where = fields.where(key)
        message = f"'{where}' must be a string (no NUL, no lone surrogate) or an integer."
        raise FieldError(ErrorCode.INVALID_TYPE, message, where)
    return token


def _decode_call(message_id: RequestId, payload: Fields) -> Message:
    capability = payload.text("capability")
    params = payload.object("params").data
    options = payload.object("options")
    # callId may sit in options (the spec's CallParams) or at the top of the payload.
    call_id = call_id_of(options, "callId")
    if call_id is None:
        call_id = call_id_of(payload, "callId")
    return CallRequest(
        id=message_id,
        capability=capability,
        params=params,
        options=CallOptions(
            timeout_ms=timeout_ms_of(options, "timeout"),
            progress_token=progress_token_of(options, "progressToken"),
            call_id=call_id,
            resent=options.boolean("resent", False),
        ),
    )


def decode_cancel(request_id: RequestId, fields: Fields) -> Message:
    """`cancel: {callId, reason?}`, in either dialect."""
    call_id = call_id_of(fields, "callId")
    if call_id is None:
        where = fields.where("callId")
        raise FieldError(ErrorCode.MISSING_PARAM, f"'{where}' is required.", where)
    return CancelRequest(id=request_id, call_id=call_id, reason=fields.optional_text("reason"))


def decode_shutdown(request_id: RequestId, fields: Fields) -> Message:
    """`shutdown: {reason?}` as a request, in either dialect."""
    return Shutdown(id=request_id, reason=fields.optional_text("reason"))


def decode_list(request_id: RequestId, fields: Fields) -> Message:
    """`capabilities/list`, in either dialect: nothing to read."""
    return ListCapabilities(id=request_id)


def _decode_elicitation(message_id: RequestId, payload: Fields) -> Message:
    return ElicitationResponse(id=message_id, payload=payload.data)


_DECODERS: dict[str, Decoder] = {
    MessageType.INITIALIZE.value: _decode_initialize,
    MessageType.CALL.value: _decode_call,
    MessageType.CANCEL.value: decode_cancel,
    MessageType.SHUTDOWN.value: decode_shutdown,
    MessageType.ELICITATION_RESPONSE.value: _decode_elicitation,
    MessageType.LIST.value: decode_list,
}
