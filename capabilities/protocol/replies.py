"""Outgoing ABP envelopes: one builder per reply type. Pure; no Django.

This module is the session's `Wire` for /abp/ws (capabilities/session/wire.py);
capabilities/jsonrpc/replies.py is the one for /abp/rpc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capabilities.protocol import ErrorCode, MessageType, RequestId, WireError, encode, responses
from capabilities.protocol.messages import REPLY_TYPES

NOT_FOUND = "Operation not found"
ALREADY_COMPLETED = "Operation already completed"

# ABP ids are message ids: a reused one is not refused (callIds are what must be unique).
UNIQUE_REQUEST_IDS = False


def store_id(request_id: RequestId) -> str:
    """The request id as the job row keeps it (ABP's are strings already)."""
    return str(request_id)


def load_id(stored: str) -> RequestId:
    """The request id of a stored call, as it is answered."""
    return stored


@dataclass(frozen=True, kw_only=True)
class SessionOpened:
    """What a session says when it opens, whichever dialect writes it.

    The session builds it once (capabilities/session/machine.py); each `Wire`
    writes it as its own initialize reply.
    """

    session_id: str
    protocol_version: str
    app: dict[str, Any]
    capabilities: list[dict[str, Any]]
    features: dict[str, bool]
    resume_token: str
    held_calls: list[str] | None = None
    """Set on a resume: the callIds the server holds that the agent may still wait on."""


def initialize_result(request_id: RequestId, opened: SessionOpened) -> str:
    """`initialize-result`, with the token that resumes the session after a drop.

    A resume's also lists `heldCalls` (our extension,
    docs/protocol.md#resuming-a-session).
    """
    payload = {
        "sessionId": opened.session_id,
        "protocolVersion": opened.protocol_version,
        "app": opened.app,
        "capabilities": opened.capabilities,
        "features": opened.features,
        "resumeToken": opened.resume_token,
    }
    if opened.held_calls is not None:
        payload["heldCalls"] = opened.held_calls
    return encode(MessageType.INITIALIZE_RESULT, payload, message_id=request_id)


def call_result(request_id: RequestId, response: dict[str, Any], *, own: bool = True) -> str:
    """`capabilities/call-result` carrying an ABPResponse.

    ABP answers a call adopted from an earlier connection (`own=False`) the same way:
    its ids are the session's, and the resuming agent still waits for them.
    """
    return encode(MessageType.CALL_RESULT, response, message_id=request_id)


def call_error(request_id: RequestId, call_id: str | None, error: WireError) -> str:
    """A call refused before it became a job."""
    return call_result(request_id, responses.failed(call_id, error, 0))


def cancel_result(
    request_id: RequestId, call_id: str, *, cancelled: bool, reason: str | None = None
) -> str:
    """`capabilities/cancel-result`."""
    payload: dict[str, Any] = {"callId": call_id, "cancelled": cancelled}
    if reason is not None:
        payload["reason"] = reason
    return encode(MessageType.CANCEL_RESULT, payload, message_id=request_id)


def notification(event: str, data: dict[str, Any]) -> str:
    """`notification {event, data}`."""
    return encode(MessageType.NOTIFICATION, {"event": event, "data": data})


@dataclass(frozen=True, kw_only=True)
class ProgressReport:
    """A call's progress, whichever dialect writes it."""

    operation_id: str | int
    """The call's progressToken."""
    call_id: str
    progress: float
    total: float | None
    stage: str
    position: int | None = None
    """While queued, when known: the call's place in its agent's line (1: next to start)."""

    @property
    def percentage(self) -> float | None:
        """`progress` out of `total`, to a tenth; none without a total."""
        return round(100.0 * self.progress / self.total, 1) if self.total else None

    @property
    def status(self) -> str:
        """`queued` while the call waits for a worker, else `running`."""
        return "queued" if self.stage == "queued" else "running"

    def to_json(self) -> dict[str, Any]:
        """The fields every dialect sends after its own names for the call."""
        fields: dict[str, Any] = {
            "progress": self.progress,
            "total": self.total,
            "percentage": self.percentage,
            "stage": self.stage,
            "status": self.status,
        }
        if self.position is not None:
            fields["position"] = self.position
        return fields


def progress(report: ProgressReport) -> str:
    """`progress` for a call that asked for it with a progressToken.

    ABP names the call by its progressToken alone (`call_id` is for dialects that
    also say it).
    """
    payload = {"operationId": report.operation_id, **report.to_json()}
    return encode(MessageType.PROGRESS, payload)


def error_for(request_type: str | None, request_id: RequestId | None, error: WireError) -> str:
    """Answer a refused message with its own reply type, or a notification if it has none."""
    reply_type = REPLY_TYPES.get(request_type or "")
    if reply_type is None or request_id is None:
        data: dict[str, Any] = error.to_json()
        if request_id is not None:
            data["requestId"] = request_id
        if request_type is not None:
            data["requestType"] = request_type[:80]
        return notification("notifications/error", data)
    if reply_type == MessageType.CALL_RESULT:
        return call_error(request_id, None, error)
    return encode(reply_type, {"error": error.to_json()}, message_id=request_id)


def not_initialized(request_type: str | None, request_id: RequestId | None) -> str:
    """The reply to anything but initialize before initialize."""
    return error_for(
        request_type,
        request_id,
        WireError(code=ErrorCode.NOT_INITIALIZED, message="Send initialize first."),
    )


def refusal(error: WireError) -> str:
    """Why the connection is refused (Daphne drops close reasons): `notifications/error`."""
    return notification("notifications/error", error.to_json())


def shutdown_result(request_id: RequestId | None) -> str | None:
    """ABP's shutdown has no reply: the close is the answer."""
    return None


def capability_list(request_id: RequestId, entries: list[dict[str, Any]]) -> str:
    """`capabilities/list-result`: the manifest's entries (ours; ABP has /abp.json)."""
    return encode(MessageType.LIST_RESULT, {"capabilities": entries}, message_id=request_id)
