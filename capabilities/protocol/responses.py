"""ABPResponse bodies of `capabilities/call-result`: one builder per outcome. Pure."""

from __future__ import annotations

from typing import Any

from capabilities.protocol.errors import ErrorCode, WireError

# Who or what cancelled a call, and how the error (and the admin: models.CancelSource)
# names it.
CANCEL_SOURCE_LABELS = {
    "agent": "Agent",
    "timeout": "Timeout",
    "shutdown": "Shutdown",
    "disconnect": "Disconnect",
    "operator": "Operator",
    "user": "User",
}


def succeeded(call_id: str, data: dict[str, Any], duration_ms: int) -> dict[str, Any]:
    """A call that produced `data`."""
    return {
        "callId": call_id,
        "success": True,
        "metadata": {"duration": duration_ms},
        "data": data,
    }


def failed(
    call_id: str | None, error: WireError, duration_ms: int, *, cancelled: bool = False
) -> dict[str, Any]:
    """A call that failed, was cancelled, or was refused before it became a job (no id)."""
    response: dict[str, Any] = {
        "success": False,
        "metadata": {"duration": duration_ms},
        "error": error.to_json(),
    }
    if call_id is not None:
        response = {"callId": call_id, **response}
    if cancelled:
        response["cancelled"] = True
    return response


def unknown_capability(name: str) -> WireError:
    """UNKNOWN_CAPABILITY for a call of a capability nobody registered."""
    return WireError(
        code=ErrorCode.UNKNOWN_CAPABILITY,
        message=f"No capability named {name[:100]!r}.",
        details={"capability": name[:100]},
    )


def cancelled_error(source: str) -> WireError:
    """The error of a cancelled call: TIMEOUT for a timeout, CANCELLED for the rest.

    `details.source` says who cancelled it (agent, operator, shutdown, disconnect).
    """
    if source == "timeout":
        return WireError(
            code=ErrorCode.TIMEOUT, message="The call timed out.", details={"source": source}
        )
    return WireError(
        code=ErrorCode.CANCELLED,
        message=f"The call was cancelled ({CANCEL_SOURCE_LABELS[source].lower()}).",
        retryable=False,
        details={"source": source},
    )


def cancelled(call_id: str, source: str, duration_ms: int) -> dict[str, Any]:
    """A call cancelled by `source`."""
    return failed(call_id, cancelled_error(source), duration_ms, cancelled=True)
