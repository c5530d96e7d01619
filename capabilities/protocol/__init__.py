"""The ABP wire format: text in, typed messages or a coded ProtocolError out, and back.

Standard library only: no Django, no I/O. See ../shared/PROTOCOL.md.
"""

from capabilities.protocol.codec import decode, encode, now_ms
from capabilities.protocol.errors import ErrorCode, ProtocolError, WireError
from capabilities.protocol.messages import (
    PROTOCOL_VERSION,
    AgentInfo,
    CallOptions,
    CallRequest,
    CancelPendingRequest,
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

__all__ = [
    "PROTOCOL_VERSION",
    "AgentInfo",
    "CallOptions",
    "CallRequest",
    "CancelPendingRequest",
    "CancelRequest",
    "ElicitationResponse",
    "ErrorCode",
    "Features",
    "Initialize",
    "ListCapabilities",
    "Message",
    "MessageType",
    "ProtocolError",
    "RequestId",
    "ResumeRequest",
    "Shutdown",
    "WireError",
    "decode",
    "encode",
    "now_ms",
]
