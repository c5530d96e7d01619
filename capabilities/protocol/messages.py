"""Typed agent -> app messages, and the names of every message type."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = "0.1"

JSON = Any  # a value that came out of json.loads
RequestId = str | int | float
"""A request's id as the client sent it: ABP's are strings, JSON-RPC's also numbers."""


class MessageType(StrEnum):
    """Envelope `type` values, both directions."""

    INITIALIZE = "initialize"
    INITIALIZE_RESULT = "initialize-result"
    CALL = "capabilities/call"
    CALL_RESULT = "capabilities/call-result"
    CANCEL = "capabilities/cancel"
    CANCEL_RESULT = "capabilities/cancel-result"
    # Ours: the manifest's capability entries, over the socket.
    LIST = "capabilities/list"
    LIST_RESULT = "capabilities/list-result"
    SHUTDOWN = "shutdown"
    NOTIFICATION = "notification"
    PROGRESS = "progress"
    ELICITATION_REQUEST = "elicitation/request"
    ELICITATION_RESPONSE = "elicitation/response"


# The reply type of each request type; messages not listed have no reply.
REPLY_TYPES: dict[str, MessageType] = {
    MessageType.INITIALIZE: MessageType.INITIALIZE_RESULT,
    MessageType.CALL: MessageType.CALL_RESULT,
    MessageType.CANCEL: MessageType.CANCEL_RESULT,
    MessageType.LIST: MessageType.LIST_RESULT,
}


@dataclass(frozen=True, kw_only=True)
class AgentInfo:
    """Who is calling."""

    name: str = ""
    version: str = ""


@dataclass(frozen=True, kw_only=True)
class Features:
    """What the agent wants sent to it besides replies."""

    notifications: bool = False
    progress: bool = False
    elicitation: bool = False


@dataclass(frozen=True, kw_only=True)
class ResumeRequest:
    """`initialize.resume`: re-attach to a session after a dropped connection."""

    session_id: str
    token: str
    awaiting: tuple[str, ...] = ()
    """The callIds the agent still waits on (our extension, docs/protocol.md)."""


@dataclass(frozen=True, kw_only=True)
class Initialize:
    """`initialize`."""

    id: RequestId
    agent: AgentInfo = field(default_factory=AgentInfo)
    protocol_version: str = PROTOCOL_VERSION
    features: Features = field(default_factory=Features)
    resume: ResumeRequest | None = None


@dataclass(frozen=True, kw_only=True)
class CallOptions:
    """`capabilities/call.options`."""

    timeout_ms: int | None = None
    progress_token: str | int | None = None
    call_id: str | None = None
    resent: bool = False
    """Sent again after a resume (our extension): a callId the session holds is not run again."""


@dataclass(frozen=True, kw_only=True)
class CallRequest:
    """`capabilities/call`."""

    id: RequestId
    capability: str
    params: dict[str, JSON] = field(default_factory=dict)
    options: CallOptions = field(default_factory=CallOptions)


@dataclass(frozen=True, kw_only=True)
class CancelRequest:
    """`capabilities/cancel`: cancel a call by its callId, confirmed."""

    id: RequestId
    call_id: str
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    """`shutdown`; JSON-RPC may send it as a notification (no id)."""

    id: RequestId | None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ElicitationResponse:
    """`elicitation/response` (no capability elicits yet)."""

    id: RequestId
    payload: dict[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ListCapabilities:
    """`capabilities/list`: the manifest's capability entries, with their schemas."""

    id: RequestId


@dataclass(frozen=True, kw_only=True)
class CancelPendingRequest:
    """JSON-RPC's `$/cancel_request`: cancel the call a request of this connection made.

    A notification: never answered itself; the request it names is.
    """

    request_id: RequestId
    id: None = None


Message = (
    Initialize
    | CallRequest
    | CancelRequest
    | Shutdown
    | ElicitationResponse
    | ListCapabilities
    | CancelPendingRequest
)
