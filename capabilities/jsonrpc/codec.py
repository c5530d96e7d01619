"""Decode JSON-RPC 2.0 frames into the session's typed messages.

`decode` returns a message, None for a notification nobody answers (unknown or
malformed ones are ignored, as JSON-RPC and ACP ask), or raises ProtocolError with a
code and whatever id it could read, whatever the input.
"""

from __future__ import annotations

import json
import math
from typing import Any

from capabilities.protocol import (
    CallOptions,
    CallRequest,
    CancelPendingRequest,
    ErrorCode,
    Features,
    Initialize,
    Message,
    ProtocolError,
    RequestId,
    Shutdown,
)
from capabilities.protocol.codec import (
    MAX_ID_LENGTH,
    Decoder,
    agent_info_of,
    body_of,
    call_id_of,
    decode_cancel,
    decode_list,
    decode_shutdown,
    parse_frame,
    progress_token_of,
    refusing_bad_fields,
    resume_request_of,
    timeout_ms_of,
)
from capabilities.protocol.fields import Fields
from capabilities.protocol.text import unstorable

CANCEL_REQUEST = "$/cancel_request"
SHUTDOWN = "_abp/shutdown"


def decode(text: str | bytes) -> Message | None:
    """One frame's message; None to ignore it; ProtocolError (coded) to refuse it."""
    raw = parse_frame(text)
    if isinstance(raw, list):
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST, "Batches are not accepted: send one message per frame."
        )
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_REQUEST, "A message must be a JSON object.")
    method = raw.get("method")
    if "id" not in raw and isinstance(method, str) and raw.get("jsonrpc") == "2.0":
        return _notification(method, raw.get("params"))
    if "method" not in raw and ("result" in raw or "error" in raw):
        return None  # a response, though we send no requests
    request_id = _request_id(raw.get("id"))
    if request_id is None:
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST,
            "'id' must be a string (at most 200 characters, no NUL, no lone surrogate) "
            "or a number.",
            details={"path": "id"},
        )
    if raw.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST,
            'A request needs "jsonrpc": "2.0" and a string "method".',
            request_id=request_id,
            request_type=method[:80] if isinstance(method, str) else None,
        )
    return _request(request_id, method, raw.get("params"))


def _request_id(value: Any) -> RequestId | None:
    """A usable id: a string every store can hold, or a finite number; short enough.

    Ids are stored with their job: strings up to 200 characters, numbers up to 200 digits.
    """
    if isinstance(value, str):
        return value if len(value) <= MAX_ID_LENGTH and not unstorable(value) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if len(json.dumps(value)) <= MAX_ID_LENGTH else None


def _notification(method: str, params: Any) -> Message | None:
    fields = params if isinstance(params, dict) else {}
    if method == CANCEL_REQUEST:
        request_id = _request_id(fields.get("requestId"))
        return None if request_id is None else CancelPendingRequest(request_id=request_id)
    if method == SHUTDOWN:
        reason = fields.get("reason")
        return Shutdown(id=None, reason=reason[:200] if isinstance(reason, str) else None)
    return None


def _request(request_id: RequestId, method: str, params: Any) -> Message:
    decoder = _DECODERS.get(method)
    if decoder is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
            f"Method not found: {method[:80]!r}.",
            request_id=request_id,
            request_type=method[:80],
        )
    with refusing_bad_fields(request_id, method):
        return decoder(request_id, body_of(params, "params", ErrorCode.INVALID_PARAMS))


def _decode_initialize(request_id: RequestId, params: Fields) -> Message:
    client = params.object("clientInfo")
    meta = params.object("_meta")
    resume = None
    if meta.get("abp/resume") is not None:
        resume = resume_request_of(meta.object("abp/resume"))
    version = params.get("protocolVersion")
    return Initialize(
        id=request_id,
        agent=agent_info_of(client),
        protocol_version=str(version)[:20] if version is not None else "1",
        features=Features(notifications=meta.boolean("abp/notifications", False), progress=True),
        resume=resume,
    )


def _decode_call(request_id: RequestId, params: Fields) -> Message:
    return CallRequest(
        id=request_id,
        capability=params.text("capability"),
        params=params.object("params").data,
        options=CallOptions(
            timeout_ms=timeout_ms_of(params, "timeout"),
            progress_token=progress_token_of(params.object("_meta"), "progressToken"),
            call_id=call_id_of(params, "callId"),
            resent=params.object("_meta").boolean("abp/resent", False),
        ),
    )


# Cancel, shutdown and list read as ABP's do; only their params' path differs.
_DECODERS: dict[str, Decoder] = {
    "initialize": _decode_initialize,
    "_abp/capabilities/list": decode_list,
    "_abp/call": _decode_call,
    "_abp/cancel": decode_cancel,
    SHUTDOWN: decode_shutdown,
}
