"""Typed agent -> app messages, and the names of every message type."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = "0.1"

JSON = Any  # a value that came out of json.loads


class MessageType(StrEnum):
    """Envelope `type` values, both directions."""

    INITIALIZE = "initialize"
    INITIALIZE_RESULT = "initialize-result"
    CALL = "capabilities/call"
    CALL_RESULT = "capabilities/call-result"
    CANCEL = "capabilities/cancel"
    CANCEL_RESULT = "capabilities/cancel-result"
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


@dataclass(frozen=True, kw_only=True)
class Initialize:
    """`initialize`."""

    id: str
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


@dataclass(frozen=True, kw_only=True)
class CallRequest:
    """`capabilities/call`."""

    id: str
    capability: str
    params: dict[str, JSON] = field(default_factory=dict)
    options: CallOptions = field(default_factory=CallOptions)


@dataclass(frozen=True, kw_only=True)
class CancelRequest:
    """`capabilities/cancel`."""

    id: str
    call_id: str
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    """`shutdown`."""

    id: str
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ElicitationResponse:
    """`elicitation/response` (no capability elicits yet)."""

    id: str
    payload: dict[str, JSON] = field(default_factory=dict)


Message = Initialize | CallRequest | CancelRequest | Shutdown | ElicitationResponse
