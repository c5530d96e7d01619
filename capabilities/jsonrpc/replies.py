"""Outgoing JSON-RPC 2.0 messages: the session's `Wire` for /abp/rpc. Pure; no Django.

capabilities/session/wire.py says what each function writes; this module writes it
as JSON-RPC responses and `_abp/...` notifications (docs/jsonrpc.md).
"""

from __future__ import annotations

import json
from typing import Any

from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.protocol import ErrorCode, RequestId, WireError
from capabilities.protocol.replies import ProgressReport, SessionOpened

# ACP's protocol version this door speaks (its initialize, not ABP's).
ACP_PROTOCOL_VERSION = 1
# JSON-RPC ids are the client's correlation: one in flight may not be reused.
UNIQUE_REQUEST_IDS = True


def store_id(request_id: RequestId) -> str:
    """The id's JSON text: `7` and `"7"` stay two ids, and come back as they were."""
    return json.dumps(request_id, ensure_ascii=False)


def load_id(stored: str) -> RequestId:
    """A stored id, as the client sent it."""
    try:
        value = json.loads(stored)
    except ValueError:
        return stored
    return value if isinstance(value, str | int | float) and not isinstance(value, bool) else stored


def _encode(message: dict[str, Any]) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", **message}, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _result(request_id: RequestId, result: dict[str, Any]) -> str:
    return _encode({"id": request_id, "result": result})


def _error_object(error: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """`{code, message, data}`: JSON-RPC's code for the ABP one, which `data` keeps."""
    code, message = jsonrpc_error(str(error.get("code", "")))
    data = {**error, "callId": call_id} if call_id is not None else dict(error)
    return {"code": code, "message": message, "data": data}


def _error(request_id: RequestId | None, error: dict[str, Any], call_id: str | None = None) -> str:
    return _encode({"id": request_id, "error": _error_object(error, call_id)})


def notify(method: str, params: dict[str, Any]) -> str:
    """A notification."""
    return _encode({"method": method, "params": params})


def initialize_result(request_id: RequestId, opened: SessionOpened) -> str:
    """ACP's InitializeResponse; the jobs' capabilities and the session under `_meta`."""
    meta: dict[str, Any] = {
        "abp/sessionId": opened.session_id,
        "abp/resumeToken": opened.resume_token,
    }
    if opened.held_calls is not None:
        meta["abp/heldCalls"] = opened.held_calls
    app = opened.app
    return _result(
        request_id,
        {
            "protocolVersion": ACP_PROTOCOL_VERSION,
            "agentInfo": {"name": app["id"], "title": app["name"], "version": app["version"]},
            "agentCapabilities": {
                "loadSession": False,
                "_meta": {
                    "abp.jobs": {
                        "protocolVersion": opened.protocol_version,
                        "capabilities": opened.capabilities,
                        "notifications": opened.features["notifications"],
                    }
                },
            },
            "authMethods": [],
            "_meta": meta,
        },
    )


def call_result(request_id: RequestId, response: dict[str, Any], *, own: bool = True) -> str:
    """The call's result or error; `_abp/result` for a call an earlier connection made.

    Request ids belong to their connection, so a call adopted by a resume cannot be
    answered as a response on this one.
    """
    call_id = response.get("callId")
    outcome: dict[str, Any]
    if response.get("success"):
        outcome = {
            "result": {
                "callId": call_id,
                "data": response.get("data"),
                "metadata": response.get("metadata"),
            }
        }
    else:
        outcome = {"error": _error_object(_rpc_paths(response["error"]), call_id)}
    if not own:
        return notify("_abp/result", {"callId": call_id, "requestId": request_id, **outcome})
    return _encode({"id": request_id, **outcome})


def call_error(request_id: RequestId, call_id: str | None, error: WireError) -> str:
    """A call refused before it became a job."""
    return _error(request_id, _rpc_paths(error.to_json()), call_id)


def cancel_result(
    request_id: RequestId, call_id: str, *, cancelled: bool, reason: str | None = None
) -> str:
    """`_abp/cancel`'s confirmation."""
    result: dict[str, Any] = {"callId": call_id, "cancelled": cancelled}
    if reason is not None:
        result["reason"] = reason
    return _result(request_id, result)


def capability_list(request_id: RequestId, entries: list[dict[str, Any]]) -> str:
    """`_abp/capabilities/list`'s result."""
    return _result(request_id, {"capabilities": entries})


def shutdown_result(request_id: RequestId | None) -> str | None:
    """`{}` for `_abp/shutdown` sent as a request; nothing for the notification."""
    return None if request_id is None else _result(request_id, {})


def notification(event: str, data: dict[str, Any]) -> str:
    """ABP's `notifications/x/y` as `_abp/x/y`."""
    return notify("_abp/" + event.removeprefix("notifications/"), data)


def progress(report: ProgressReport) -> str:
    """`_abp/progress` for the call's progressToken."""
    params = {"progressToken": report.operation_id, "callId": report.call_id, **report.to_json()}
    return notify("_abp/progress", params)


def error_for(request_type: str | None, request_id: RequestId | None, error: WireError) -> str:
    """An error response (id null when the id could not be read)."""
    return _error(request_id, error.to_json())


def not_initialized(request_type: str | None, request_id: RequestId | None) -> str:
    """The answer to anything but initialize before initialize."""
    error = WireError(code=ErrorCode.NOT_INITIALIZED, message="Send initialize first.")
    return error_for(request_type, request_id, error)


def refusal(error: WireError) -> str:
    """Why the connection is refused: an error with id null, before the close."""
    return _error(None, error.to_json())


def _rpc_paths(error: dict[str, Any]) -> dict[str, Any]:
    """Name a call's fields as this door's params nest them.

    The call service and the capabilities name fields as ABP's payload does
    (`payload.options.timeout`, `params.html`); here they are `params.timeout` and
    `params.params.html`.
    """
    details = error.get("details")
    if not isinstance(details, dict) or not isinstance(details.get("path"), str):
        return error
    path: str = details["path"]
    if path.startswith("payload.options."):
        path = "params." + path.removeprefix("payload.options.")
    elif path.startswith("payload."):
        path = "params." + path.removeprefix("payload.")
    elif path == "params" or path.startswith("params."):
        path = "params." + path
    return {**error, "details": {**details, "path": path}}
