"""Which JSON-RPC error code each ABP error code is answered with (docs/jsonrpc.md)."""

from __future__ import annotations

from capabilities.protocol import ErrorCode

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# ACP's: authentication required, resource not found, request cancelled.
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800
# Ours, in JSON-RPC's range for implementation-defined server errors.
CALL_FAILED = -32001

_TABLE: dict[str, tuple[int, str]] = {
    ErrorCode.PARSE_ERROR: (PARSE_ERROR, "Parse error"),
    ErrorCode.INVALID_REQUEST: (INVALID_REQUEST, "Invalid request"),
    ErrorCode.NOT_INITIALIZED: (INVALID_REQUEST, "Invalid request"),
    ErrorCode.ALREADY_INITIALIZED: (INVALID_REQUEST, "Invalid request"),
    ErrorCode.UNKNOWN_MESSAGE_TYPE: (METHOD_NOT_FOUND, "Method not found"),
    ErrorCode.INVALID_PARAMS: (INVALID_PARAMS, "Invalid params"),
    ErrorCode.MISSING_PARAM: (INVALID_PARAMS, "Invalid params"),
    ErrorCode.INVALID_TYPE: (INVALID_PARAMS, "Invalid params"),
    ErrorCode.UNKNOWN_CAPABILITY: (INVALID_PARAMS, "Invalid params"),
    ErrorCode.INTERNAL_ERROR: (INTERNAL_ERROR, "Internal error"),
    ErrorCode.CANCELLED: (REQUEST_CANCELLED, "Request cancelled"),
    ErrorCode.TIMEOUT: (REQUEST_CANCELLED, "Request cancelled"),
    ErrorCode.PERMISSION_DENIED: (AUTH_REQUIRED, "Authentication required"),
    ErrorCode.SESSION_INVALID: (RESOURCE_NOT_FOUND, "Resource not found"),
    ErrorCode.SESSION_EXPIRED: (RESOURCE_NOT_FOUND, "Resource not found"),
}


def jsonrpc_error(code: str) -> tuple[int, str]:
    """The JSON-RPC code and message for an ABP error code; any other failure: -32001."""
    return _TABLE.get(code, (CALL_FAILED, "Call failed"))
