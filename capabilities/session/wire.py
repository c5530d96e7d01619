"""How a session writes its replies: the dialect of the door it came in by.

The session decides what to answer; a `Wire` writes it. ABP's is the module
capabilities/protocol/replies.py (/abp/ws), JSON-RPC's capabilities/jsonrpc/replies.py
(/abp/rpc). Modules satisfy this protocol as they are.
"""

from __future__ import annotations

from typing import Any, Protocol

from capabilities.protocol import RequestId, WireError
from capabilities.protocol.replies import ProgressReport, SessionOpened


class Wire(Protocol):
    """Everything a session sends, written in one dialect."""

    UNIQUE_REQUEST_IDS: bool
    """Whether a request id still in flight is refused when reused."""

    def store_id(self, request_id: RequestId) -> str:
        """The request id as the job row keeps it."""

    def load_id(self, stored: str) -> RequestId:
        """A stored request id, as it is answered."""

    def initialize_result(self, request_id: RequestId, opened: SessionOpened) -> str:
        """The session is open (or resumed; then with the callIds the server holds)."""

    def call_result(
        self, request_id: RequestId, response: dict[str, Any], *, own: bool = True
    ) -> str:
        """A call's ABPResponse; `own`: asked on this connection, not adopted."""

    def call_error(self, request_id: RequestId, call_id: str | None, error: WireError) -> str:
        """A call refused before it became a job."""

    def cancel_result(
        self, request_id: RequestId, call_id: str, *, cancelled: bool, reason: str | None = None
    ) -> str:
        """The confirmation of a cancel by callId."""

    def capability_list(self, request_id: RequestId, entries: list[dict[str, Any]]) -> str:
        """The capabilities, with their schemas."""

    def shutdown_result(self, request_id: RequestId | None) -> str | None:
        """The reply to a shutdown, if the dialect has one."""

    def notification(self, event: str, data: dict[str, Any]) -> str:
        """An ABP notification event (`notifications/...`), in this dialect."""

    def progress(self, report: ProgressReport) -> str:
        """A call's progress, for its progressToken."""

    def error_for(
        self, request_type: str | None, request_id: RequestId | None, error: WireError
    ) -> str:
        """A refused message's answer."""

    def not_initialized(self, request_type: str | None, request_id: RequestId | None) -> str:
        """The answer to anything but initialize before initialize."""

    def refusal(self, error: WireError) -> str:
        """Why the connection is refused, before it closes."""
