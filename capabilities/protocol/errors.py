"""Error codes on the wire, and the one exception the decoder produces.

Wire codes are separate from exceptions: a `WireError` is the `{code, message,
retryable, retryAfter?, details?}` object; `ProtocolError` wraps one together with
what we could read of the offending envelope, so the session can answer it with the
right reply type.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Every error code we send: the spec's, plus our own where none fits."""

    NOT_INITIALIZED = "NOT_INITIALIZED"
    ALREADY_INITIALIZED = "ALREADY_INITIALIZED"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    SESSION_INVALID = "SESSION_INVALID"
    UNKNOWN_CAPABILITY = "UNKNOWN_CAPABILITY"
    CAPABILITY_UNAVAILABLE = "CAPABILITY_UNAVAILABLE"
    INVALID_PARAMS = "INVALID_PARAMS"
    MISSING_PARAM = "MISSING_PARAM"
    INVALID_TYPE = "INVALID_TYPE"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    OPERATION_FAILED = "OPERATION_FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    RATE_LIMITED = "RATE_LIMITED"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    TRANSPORT_ERROR = "TRANSPORT_ERROR"
    DISCONNECTED = "DISCONNECTED"
    # Ours: the worker running the job died; running the call again may work.
    WORKER_LOST = "WORKER_LOST"
    # Ours: the frame is not JSON, not an object, or not a well-formed envelope.
    PARSE_ERROR = "PARSE_ERROR"
    # Ours: a well-formed envelope of a type we do not know.
    UNKNOWN_MESSAGE_TYPE = "UNKNOWN_MESSAGE_TYPE"
    # Ours: a JSON-RPC message that is not a request we can take (/abp/rpc).
    INVALID_REQUEST = "INVALID_REQUEST"


# Codes for which trying the same thing again later may succeed.
RETRYABLE_CODES = frozenset(
    {
        ErrorCode.RATE_LIMITED,
        ErrorCode.INTERNAL_ERROR,
        ErrorCode.TRANSPORT_ERROR,
        ErrorCode.DISCONNECTED,
        ErrorCode.WORKER_LOST,
        ErrorCode.TIMEOUT,
        ErrorCode.CAPABILITY_UNAVAILABLE,
    }
)


@dataclass(frozen=True, kw_only=True)
class WireError:
    """The `error` object of a reply."""

    code: str
    message: str
    retryable: bool | None = None
    retry_after_ms: int | None = None
    details: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Serialize; `retryable` defaults from the code when not given."""
        retryable = self.retryable
        if retryable is None:
            retryable = self.code in RETRYABLE_CODES
        data: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": retryable}
        if self.retry_after_ms is not None:
            data["retryAfter"] = self.retry_after_ms
        if self.details:
            data["details"] = self.details
        return data


class ProtocolError(Exception):
    """A frame we cannot accept, with whatever of its envelope we could read."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        request_id: str | int | float | None = None,
        request_type: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.error = WireError(code=code, message=message, details=details)
        self.request_id = request_id
        self.request_type = request_type

    @property
    def code(self) -> str:
        """The wire code."""
        return self.error.code
