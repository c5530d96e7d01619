"""Typed errors: an ABP error object (`{code, message, retryable, retryAfter, details}`)."""

from __future__ import annotations

from typing import Any


class ABPError(Exception):
    """A call or request the server answered with an error (or the connection lost)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        retry_after_ms: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.details = details or {}

    @classmethod
    def from_wire(cls, error: dict[str, Any]) -> ABPError:
        """The typed error for an error object as the server sent it."""
        code = str(error.get("code", "INTERNAL_ERROR"))
        kind = _BY_CODE.get(code, ABPError)
        retry_after = error.get("retryAfter")
        return kind(
            code,
            str(error.get("message", "")),
            retryable=bool(error.get("retryable", False)),
            retry_after_ms=int(retry_after) if isinstance(retry_after, int | float) else None,
            details=error.get("details") if isinstance(error.get("details"), dict) else None,
        )


class CallCancelled(ABPError):
    """The call was cancelled: by this client, an operator, a shutdown or the server."""


class CallTimedOut(ABPError):
    """The call ran past its timeout; the server stopped its work."""


class WorkerLost(ABPError):
    """The worker running the call died (retryable)."""


class Disconnected(ABPError):
    """The connection was lost and could not be resumed within the grace period."""


class InvalidParams(ABPError):
    """The params broke the capability's schema or limits (`details.path` says where)."""


class RateLimited(ABPError):
    """Too many calls; `retry_after_ms` says when to try again."""


class Unavailable(ABPError):
    """No worker runs this capability now (retryable)."""


_BY_CODE: dict[str, type[ABPError]] = {
    "CANCELLED": CallCancelled,
    "TIMEOUT": CallTimedOut,
    "WORKER_LOST": WorkerLost,
    "DISCONNECTED": Disconnected,
    "INVALID_PARAMS": InvalidParams,
    "MISSING_PARAM": InvalidParams,
    "INVALID_TYPE": InvalidParams,
    "RATE_LIMITED": RateLimited,
    "CAPABILITY_UNAVAILABLE": Unavailable,
}
