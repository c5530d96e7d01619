"""Outgoing envelopes: one builder per reply type."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from capabilities.protocol import ErrorCode, WireError, replies

ERROR = WireError(code=ErrorCode.INVALID_PARAMS, message="Bad html.", details={"path": "html"})
ERROR_JSON = {
    "code": "INVALID_PARAMS",
    "message": "Bad html.",
    "retryable": False,
    "details": {"path": "html"},
}


def parse(text: str) -> dict[str, Any]:
    """An envelope, checked for the fields every envelope has."""
    assert ": " not in text  # compact
    envelope: dict[str, Any] = json.loads(text)
    assert list(envelope) == ["type", "id", "timestamp", "payload"]
    assert isinstance(envelope["id"], str)
    assert envelope["id"]
    assert type(envelope["timestamp"]) is int
    assert envelope["timestamp"] > 1_600_000_000_000
    return envelope


def is_fresh_id(value: str) -> bool:
    return str(uuid.UUID(value)) == value


def test_initialize_result() -> None:
    envelope = parse(
        replies.initialize_result(
            "init-1",
            replies.SessionOpened(
                session_id="s-1",
                protocol_version="0.1",
                app={"id": "app"},
                capabilities=[{"name": "export.pdf", "available": True}],
                features={"notifications": True, "progress": True, "elicitation": False},
                resume_token="t0k",
            ),
        )
    )
    assert envelope["type"] == "initialize-result"
    assert envelope["id"] == "init-1"
    assert envelope["payload"] == {
        "sessionId": "s-1",
        "protocolVersion": "0.1",
        "app": {"id": "app"},
        "capabilities": [{"name": "export.pdf", "available": True}],
        "features": {"notifications": True, "progress": True, "elicitation": False},
        "resumeToken": "t0k",
    }


def test_call_result_carries_the_response_as_is() -> None:
    response = {
        "callId": "c",
        "success": True,
        "data": {"html": "<p/>"},
        "metadata": {"duration": 5},
    }
    envelope = parse(replies.call_result("req-1", response))
    assert envelope["type"] == "capabilities/call-result"
    assert envelope["id"] == "req-1"
    assert envelope["payload"] == response


def test_call_error_with_call_id() -> None:
    envelope = parse(replies.call_error("req-2", "c-2", ERROR))
    assert envelope["type"] == "capabilities/call-result"
    assert envelope["id"] == "req-2"
    assert envelope["payload"] == {
        "callId": "c-2",
        "success": False,
        "error": ERROR_JSON,
        "metadata": {"duration": 0},
    }


def test_call_error_without_call_id() -> None:
    envelope = parse(replies.call_error("req-3", None, ERROR))
    assert envelope["payload"] == {
        "success": False,
        "error": ERROR_JSON,
        "metadata": {"duration": 0},
    }


def test_call_error_retryable_from_the_code() -> None:
    error = WireError(code=ErrorCode.WORKER_LOST, message="Worker died.", retry_after_ms=1000)
    payload = parse(replies.call_error("r", "c", error))["payload"]
    assert payload["error"] == {
        "code": "WORKER_LOST",
        "message": "Worker died.",
        "retryable": True,
        "retryAfter": 1000,
    }


@pytest.mark.parametrize("cancelled", [True, False])
def test_cancel_result_without_reason(cancelled: bool) -> None:
    envelope = parse(replies.cancel_result("k-1", "c-1", cancelled=cancelled))
    assert envelope["type"] == "capabilities/cancel-result"
    assert envelope["id"] == "k-1"
    assert envelope["payload"] == {"callId": "c-1", "cancelled": cancelled}


@pytest.mark.parametrize("reason", [replies.NOT_FOUND, replies.ALREADY_COMPLETED, ""])
def test_cancel_result_with_reason(reason: str) -> None:
    envelope = parse(replies.cancel_result("k-2", "c-2", cancelled=False, reason=reason))
    assert envelope["payload"] == {"callId": "c-2", "cancelled": False, "reason": reason}


def test_cancel_reasons_are_the_documented_texts() -> None:
    assert replies.NOT_FOUND == "Operation not found"
    assert replies.ALREADY_COMPLETED == "Operation already completed"


def test_notification() -> None:
    envelope = parse(
        replies.notification("notifications/operation/started", {"operationId": "c-1"})
    )
    assert envelope["type"] == "notification"
    assert is_fresh_id(envelope["id"])
    assert envelope["payload"] == {
        "event": "notifications/operation/started",
        "data": {"operationId": "c-1"},
    }


def test_notifications_get_fresh_ids() -> None:
    first = parse(replies.notification("e", {}))["id"]
    second = parse(replies.notification("e", {}))["id"]
    assert first != second


@pytest.mark.parametrize(
    ("done", "total", "percentage"),
    [(1, 4, 25.0), (1, 3, 33.3), (2, 3, 66.7), (0, 10, 0.0), (10, 10, 100.0), (0.5, 2, 25.0)],
)
def test_progress_percentage(done: float, total: float, percentage: float) -> None:
    envelope = parse(
        replies.progress(
            replies.ProgressReport(
                operation_id="tok-1", call_id="c1", progress=done, total=total, stage="rendering"
            )
        )
    )
    assert envelope["type"] == "progress"
    assert is_fresh_id(envelope["id"])
    assert envelope["payload"] == {
        "operationId": "tok-1",
        "progress": done,
        "total": total,
        "percentage": percentage,
        "stage": "rendering",
        "status": "running",
    }


@pytest.mark.parametrize("total", [None, 0, 0.0])
def test_progress_without_a_total_has_no_percentage(total: float | None) -> None:
    payload = parse(
        replies.progress(
            replies.ProgressReport(
                operation_id=7, call_id="c1", progress=3, total=total, stage="fetching"
            )
        )
    )["payload"]
    assert payload["operationId"] == 7
    assert payload["total"] == total
    assert payload["percentage"] is None


def test_progress_keeps_an_integer_token() -> None:
    payload = parse(
        replies.progress(
            replies.ProgressReport(operation_id=0, call_id="c1", progress=1, total=2, stage="s")
        )
    )["payload"]
    assert payload["operationId"] == 0
    assert type(payload["operationId"]) is int


# -- error_for --------------------------------------------------------------------------------


def test_error_for_initialize() -> None:
    envelope = parse(replies.error_for("initialize", "i-1", ERROR))
    assert envelope["type"] == "initialize-result"
    assert envelope["id"] == "i-1"
    assert envelope["payload"] == {"error": ERROR_JSON}


def test_error_for_call_is_an_abp_response() -> None:
    envelope = parse(replies.error_for("capabilities/call", "q-1", ERROR))
    assert envelope["type"] == "capabilities/call-result"
    assert envelope["id"] == "q-1"
    assert envelope["payload"] == {
        "success": False,
        "error": ERROR_JSON,
        "metadata": {"duration": 0},
    }


def test_error_for_cancel() -> None:
    envelope = parse(replies.error_for("capabilities/cancel", "k-1", ERROR))
    assert envelope["type"] == "capabilities/cancel-result"
    assert envelope["id"] == "k-1"
    assert envelope["payload"] == {"error": ERROR_JSON}


@pytest.mark.parametrize(
    "request_type",
    ["shutdown", "elicitation/response", "ping", "initialize-result", "capabilities/call-result"],
)
def test_error_for_a_type_without_reply_is_a_notification(request_type: str) -> None:
    envelope = parse(replies.error_for(request_type, "m-1", ERROR))
    assert envelope["type"] == "notification"
    assert envelope["id"] != "m-1"
    assert envelope["payload"] == {
        "event": "notifications/error",
        "data": {**ERROR_JSON, "requestId": "m-1", "requestType": request_type},
    }


def test_error_for_unknown_type_and_id() -> None:
    envelope = parse(replies.error_for(None, None, ERROR))
    assert envelope["type"] == "notification"
    assert envelope["payload"] == {"event": "notifications/error", "data": ERROR_JSON}


def test_error_for_id_without_type() -> None:
    data = parse(replies.error_for(None, "m-2", ERROR))["payload"]["data"]
    assert data == {**ERROR_JSON, "requestId": "m-2"}


@pytest.mark.parametrize("request_type", ["initialize", "capabilities/call", "capabilities/cancel"])
def test_error_for_a_reply_type_without_id_is_a_notification(request_type: str) -> None:
    # A reply must echo the request id; without one there is nothing to reply to.
    envelope = parse(replies.error_for(request_type, None, ERROR))
    assert envelope["type"] == "notification"
    assert envelope["payload"]["data"] == {**ERROR_JSON, "requestType": request_type}


def test_error_for_truncates_a_long_request_type() -> None:
    data = parse(replies.error_for("x" * 500, "m", ERROR))["payload"]["data"]
    assert data["requestType"] == "x" * 80


def test_not_initialized() -> None:
    envelope = parse(replies.not_initialized("capabilities/call", "q"))
    assert envelope["type"] == "capabilities/call-result"
    assert envelope["id"] == "q"
    assert envelope["payload"]["success"] is False
    assert envelope["payload"]["error"] == {
        "code": "NOT_INITIALIZED",
        "message": "Send initialize first.",
        "retryable": False,
    }
    data = parse(replies.not_initialized("shutdown", "s"))["payload"]["data"]
    assert data["code"] == "NOT_INITIALIZED"
    assert (data["requestId"], data["requestType"]) == ("s", "shutdown")
