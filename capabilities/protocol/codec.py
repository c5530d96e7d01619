"""Decode frames into typed messages and encode replies.

`decode` never raises anything but `ProtocolError`, whatever the input: every
rejection has a code, and carries the envelope's id and type when they could be read.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from capabilities.protocol.errors import ErrorCode, ProtocolError
from capabilities.protocol.messages import (
    JSON,
    AgentInfo,
    CallOptions,
    CallRequest,
    CancelRequest,
    ElicitationResponse,
    Features,
    Initialize,
    Message,
    MessageType,
    ResumeRequest,
    Shutdown,
)
from capabilities.protocol.text import unstorable

MAX_ID_LENGTH = 200


def now_ms() -> int:
    """Unix time in milliseconds, the envelope's `timestamp`."""
    return time.time_ns() // 1_000_000


def encode(message_type: str, payload: dict[str, Any], *, message_id: str | None = None) -> str:
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
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError) as exc:
        # Only the class goes on the wire: JSON error texts may quote the input.
        raise ProtocolError(ErrorCode.PARSE_ERROR, "Frame is not valid JSON.") from exc
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.PARSE_ERROR, "Frame must be a JSON object (an envelope).")
    return _decode_envelope(raw)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


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
    timestamp = raw.get("timestamp")
    if timestamp is not None and not _is_number(timestamp):
        raise ProtocolError(
            ErrorCode.INVALID_TYPE,
            "'timestamp' must be a number (Unix ms).",
            request_id=readable_id,
            request_type=readable_type,
            details={"path": "timestamp"},
        )
    payload = raw.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise ProtocolError(
            ErrorCode.INVALID_TYPE,
            "'payload' must be an object.",
            request_id=readable_id,
            request_type=readable_type,
            details={"path": "payload"},
        )
    decoder = _DECODERS.get(readable_type)
    if decoder is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"Unknown message type {readable_type[:80]!r}.",
            request_id=readable_id,
            request_type=readable_type,
        )
    reader = _PayloadReader(readable_id, readable_type)
    return decoder(readable_id, payload, reader)


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


class _PayloadReader:
    """Typed field access that turns every mismatch into a coded ProtocolError."""

    def __init__(self, request_id: str, request_type: str) -> None:
        self.request_id = request_id
        self.request_type = request_type

    def fail(self, code: ErrorCode, message: str, path: str) -> ProtocolError:
        return ProtocolError(
            code,
            message,
            request_id=self.request_id,
            request_type=self.request_type,
            details={"path": path},
        )

    def obj(self, data: dict[str, JSON], key: str, path: str) -> dict[str, JSON]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(ErrorCode.INVALID_TYPE, f"'{path}' must be an object.", path)
        return value

    def string(
        self, data: dict[str, JSON], key: str, path: str, *, required: bool = False
    ) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                raise self.fail(ErrorCode.MISSING_PARAM, f"'{path}' is required.", path)
            return None
        if not isinstance(value, str):
            raise self.fail(ErrorCode.INVALID_TYPE, f"'{path}' must be a string.", path)
        problem = unstorable(value)
        if problem is not None:
            raise self.fail(ErrorCode.INVALID_PARAMS, f"'{path}' must not contain {problem}.", path)
        return value

    def boolean(self, data: dict[str, JSON], key: str, path: str) -> bool:
        value = data.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(ErrorCode.INVALID_TYPE, f"'{path}' must be a boolean.", path)
        return value

    def call_id(self, data: dict[str, JSON], key: str, path: str) -> str | None:
        value = self.string(data, key, path)
        if value is not None and not 0 < len(value) <= MAX_ID_LENGTH:
            raise self.fail(
                ErrorCode.INVALID_PARAMS,
                f"'{path}' must be 1 to {MAX_ID_LENGTH} characters.",
                path,
            )
        return value


def _decode_initialize(message_id: str, payload: dict[str, JSON], r: _PayloadReader) -> Message:
    agent = r.obj(payload, "agent", "payload.agent")
    features = r.obj(payload, "features", "payload.features")
    resume = r.obj(payload, "resume", "payload.resume") if "resume" in payload else None
    resume_request = None
    if resume is not None and payload.get("resume") is not None:
        resume_request = ResumeRequest(
            session_id=r.string(resume, "sessionId", "payload.resume.sessionId", required=True)
            or "",
            token=r.string(resume, "token", "payload.resume.token", required=True) or "",
        )
    return Initialize(
        id=message_id,
        agent=AgentInfo(
            name=r.string(agent, "name", "payload.agent.name") or "",
            version=r.string(agent, "version", "payload.agent.version") or "",
        ),
        protocol_version=r.string(payload, "protocolVersion", "payload.protocolVersion") or "0.1",
        features=Features(
            notifications=r.boolean(features, "notifications", "payload.features.notifications"),
            progress=r.boolean(features, "progress", "payload.features.progress"),
            elicitation=r.boolean(features, "elicitation", "payload.features.elicitation"),
        ),
        resume=resume_request,
    )


def _decode_call(message_id: str, payload: dict[str, JSON], r: _PayloadReader) -> Message:
    capability = r.string(payload, "capability", "payload.capability", required=True) or ""
    params = r.obj(payload, "params", "payload.params")
    options = r.obj(payload, "options", "payload.options")
    timeout = options.get("timeout")
    timeout_ms: int | None = None
    if timeout is not None:
        if not _is_number(timeout) or timeout <= 0:
            raise r.fail(
                ErrorCode.INVALID_TYPE,
                "'payload.options.timeout' must be a positive number of milliseconds.",
                "payload.options.timeout",
            )
        timeout_ms = max(1, int(timeout))
    token = options.get("progressToken")
    if token is not None and (
        isinstance(token, bool)
        or not isinstance(token, str | int)
        or len(str(token)) > 200
        or (isinstance(token, str) and unstorable(token))
    ):
        raise r.fail(
            ErrorCode.INVALID_TYPE,
            "'payload.options.progressToken' must be a string (no NUL, no lone surrogate) "
            "or an integer.",
            "payload.options.progressToken",
        )
    # callId may sit in options (the spec's CallParams) or at the top of the payload.
    call_id = r.call_id(options, "callId", "payload.options.callId")
    if call_id is None:
        call_id = r.call_id(payload, "callId", "payload.callId")
    return CallRequest(
        id=message_id,
        capability=capability,
        params=params,
        options=CallOptions(timeout_ms=timeout_ms, progress_token=token, call_id=call_id),
    )


def _decode_cancel(message_id: str, payload: dict[str, JSON], r: _PayloadReader) -> Message:
    call_id = r.call_id(payload, "callId", "payload.callId")
    if call_id is None:
        raise r.fail(ErrorCode.MISSING_PARAM, "'payload.callId' is required.", "payload.callId")
    return CancelRequest(
        id=message_id, call_id=call_id, reason=r.string(payload, "reason", "payload.reason")
    )


def _decode_shutdown(message_id: str, payload: dict[str, JSON], r: _PayloadReader) -> Message:
    return Shutdown(id=message_id, reason=r.string(payload, "reason", "payload.reason"))


def _decode_elicitation(message_id: str, payload: dict[str, JSON], r: _PayloadReader) -> Message:
    return ElicitationResponse(id=message_id, payload=payload)


_DECODERS = {
    MessageType.INITIALIZE.value: _decode_initialize,
    MessageType.CALL.value: _decode_call,
    MessageType.CANCEL.value: _decode_cancel,
    MessageType.SHUTDOWN.value: _decode_shutdown,
    MessageType.ELICITATION_RESPONSE.value: _decode_elicitation,
}
