"""The per-connection ABP state machine: messages in, actions out. No I/O.

States: NEW (before initialize) -> OPEN -> CLOSED. The consumer performs the
actions in order, and reports back what it learned (`call_started`, `finish`,
`resumed`). A session can outlive its connection: a drop detaches it (when
resuming is on), and `initialize` with `resume` on a new connection takes it back.
The table of in-flight calls lives here; a call leaves it exactly once (`finish`),
which is what makes every call answered exactly once on this connection.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from capabilities import replies
from capabilities.protocol import (
    PROTOCOL_VERSION,
    CallRequest,
    CancelRequest,
    ElicitationResponse,
    ErrorCode,
    Features,
    Initialize,
    Message,
    ProtocolError,
    Shutdown,
    WireError,
)


class SessionState(Enum):
    """Where the connection is."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, kw_only=True)
class Send:
    """Send this encoded envelope to the agent."""

    text: str


@dataclass(frozen=True, kw_only=True)
class OpenSession:
    """Record the session and join its group; then the next Send answers initialize."""

    session_id: str
    message: Initialize
    resume_token: str


@dataclass(frozen=True, kw_only=True)
class ResumeSession:
    """Take an existing session over; report back with `resumed` or `resume_refused`."""

    request_id: str
    session_id: str
    token: str
    message: Initialize


@dataclass(frozen=True, kw_only=True)
class Detach:
    """The socket dropped: keep the calls running for a resume within the grace period."""


@dataclass(frozen=True, kw_only=True)
class StartCall:
    """Create the job and enqueue it; report back with `call_started` or an error."""

    request_id: str
    call_id: str
    capability: str
    params: dict[str, Any]
    timeout_ms: int | None
    progress_token: str | int | None


@dataclass(frozen=True, kw_only=True)
class CancelCall:
    """Settle the call as cancelled (if in flight) and answer the cancel."""

    request_id: str
    call_id: str
    reason: str
    in_flight: bool


@dataclass(frozen=True, kw_only=True)
class EndCalls:
    """Cancel every in-flight call (shutdown, disconnect) and answer each once."""

    reason: str
    source: str


@dataclass(frozen=True, kw_only=True)
class Close:
    """Close the connection."""

    code: int


Action = Send | OpenSession | ResumeSession | StartCall | CancelCall | EndCalls | Detach | Close


@dataclass(frozen=True, kw_only=True)
class InFlight:
    """A call that has not been answered yet."""

    call_id: str
    request_id: str
    job_id: str
    progress_token: str | int | None


class Session:
    """One connection's ABP session."""

    def __init__(
        self,
        *,
        capability_names: Callable[[], list[str]],
        app: dict[str, Any],
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        max_concurrent_calls: int | None = None,
        max_timeout_ms: Callable[[str], int] | None = None,
        resumable: bool = False,
        new_token: Callable[[], str] = lambda: secrets.token_urlsafe(32),
    ) -> None:
        self.state = SessionState.NEW
        self.session_id: str | None = None
        self.features = Features()
        self._capability_names = capability_names
        self._app = app
        self._new_id = new_id
        self._calls: dict[str, InFlight] = {}
        self._max_calls = max_concurrent_calls
        self._max_timeout_ms = max_timeout_ms
        self._resumable = resumable
        self._new_token = new_token

    # -- messages in -------------------------------------------------------------

    def receive(self, message: Message | ProtocolError) -> list[Action]:
        """What to do about one decoded frame (or one that failed to decode)."""
        if self.state is SessionState.CLOSED:
            return []
        if isinstance(message, ProtocolError):
            return self._refuse(message)
        if isinstance(message, Initialize):
            return self._initialize(message)
        if self.state is SessionState.NEW:
            return [Send(text=replies.not_initialized(_type_of(message), message.id))]
        if isinstance(message, CallRequest):
            return self._call(message)
        if isinstance(message, CancelRequest):
            return self._cancel(message)
        if isinstance(message, Shutdown):
            return self._shutdown(message)
        assert isinstance(message, ElicitationResponse)
        error = WireError(code=ErrorCode.INVALID_PARAMS, message="No elicitation is pending.")
        return [Send(text=replies.error_for("elicitation/response", message.id, error))]

    def disconnected(self) -> list[Action]:
        """The socket dropped: the session waits for a resume, or its calls are cancelled."""
        if self.state is not SessionState.OPEN:
            self.state = SessionState.CLOSED
            return []
        self.state = SessionState.CLOSED
        if self._resumable:
            self._calls.clear()  # they are the resuming connection's to answer
            return [Detach()]
        return [EndCalls(reason="connection closed", source="disconnect")]

    def revoked(self) -> list[Action]:
        """The connection's agent key was revoked: every in-flight call is cancelled."""
        was_open = self.state is SessionState.OPEN
        self.state = SessionState.CLOSED
        if not was_open:
            return []
        return [EndCalls(reason="agent key revoked", source="operator")]

    def _refuse(self, error: ProtocolError) -> list[Action]:
        if self.state is SessionState.NEW and error.request_type not in (None, "initialize"):
            return [Send(text=replies.not_initialized(error.request_type, error.request_id))]
        return [Send(text=replies.error_for(error.request_type, error.request_id, error.error))]

    def _initialize(self, message: Initialize) -> list[Action]:
        if self.state is not SessionState.NEW:
            error = WireError(
                code=ErrorCode.ALREADY_INITIALIZED, message="This connection is initialized."
            )
            return [Send(text=replies.error_for("initialize", message.id, error))]
        if message.resume is not None:
            if not self._resumable:
                error = WireError(
                    code=ErrorCode.SESSION_INVALID, message="Sessions cannot be resumed here."
                )
                return [Send(text=replies.error_for("initialize", message.id, error))]
            return [
                ResumeSession(
                    request_id=message.id,
                    session_id=message.resume.session_id,
                    token=message.resume.token,
                    message=message,
                )
            ]
        token = self._new_token()
        reply = self._open(message, self._new_id(), token)
        assert self.session_id is not None
        return [
            OpenSession(session_id=self.session_id, message=message, resume_token=token),
            Send(text=reply),
        ]

    def _open(self, message: Initialize, session_id: str, token: str) -> str:
        self.state = SessionState.OPEN
        self.session_id = session_id
        self.features = message.features
        return replies.initialize_result(
            message.id,
            session_id=session_id,
            protocol_version=PROTOCOL_VERSION,
            app=self._app,
            capabilities=[{"name": name, "available": True} for name in self._capability_names()],
            features={
                "notifications": message.features.notifications,
                "progress": message.features.progress,
                "elicitation": False,
            },
            resume_token=token,
        )

    def resumed(self, action: ResumeSession, *, token: str, calls: list[InFlight]) -> list[Action]:
        """The session was taken over: its calls not yet answered are this connection's."""
        if self.state is not SessionState.NEW:
            return []
        reply = self._open(action.message, action.session_id, token)
        self._calls = {call.call_id: call for call in calls}
        return [Send(text=reply)]

    def resume_refused(self, action: ResumeSession, error: WireError) -> list[Action]:
        """The session could not be resumed; the connection may still initialize afresh."""
        return [Send(text=replies.error_for("initialize", action.request_id, error))]

    def _call(self, message: CallRequest) -> list[Action]:
        call_id = message.options.call_id or self._new_id()
        if call_id in self._calls:
            error = WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"callId {call_id!r} is already running in this session.",
                details={"path": "payload.options.callId"},
            )
            return [Send(text=replies.call_error(message.id, call_id, error))]
        if message.capability not in self._capability_names():
            error = WireError(
                code=ErrorCode.UNKNOWN_CAPABILITY,
                message=f"No capability named {message.capability[:100]!r}.",
                details={"capability": message.capability[:100]},
            )
            return [Send(text=replies.call_error(message.id, call_id, error))]
        timeout_ms = message.options.timeout_ms
        max_timeout_ms = (
            None if self._max_timeout_ms is None else self._max_timeout_ms(message.capability)
        )
        if max_timeout_ms is not None and (timeout_ms or 0) > max_timeout_ms:
            error = WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"options.timeout may be at most {max_timeout_ms} ms "
                f"for {message.capability}.",
                details={"path": "payload.options.timeout", "max": max_timeout_ms},
            )
            return [Send(text=replies.call_error(message.id, call_id, error))]
        if self._max_calls is not None and len(self._calls) >= self._max_calls:
            error = WireError(
                code=ErrorCode.RATE_LIMITED,
                message=f"At most {self._max_calls} calls may be in flight at once; "
                "wait for one to finish.",
                details={"limit": "concurrentCalls", "max": self._max_calls},
            )
            return [Send(text=replies.call_error(message.id, call_id, error))]
        return [
            StartCall(
                request_id=message.id,
                call_id=call_id,
                capability=message.capability,
                params=message.params,
                timeout_ms=message.options.timeout_ms,
                progress_token=message.options.progress_token,
            )
        ]

    def _cancel(self, message: CancelRequest) -> list[Action]:
        return [
            CancelCall(
                request_id=message.id,
                call_id=message.call_id,
                reason=message.reason or "",
                in_flight=message.call_id in self._calls,
            )
        ]

    def _shutdown(self, message: Shutdown) -> list[Action]:
        self.state = SessionState.CLOSED
        return [EndCalls(reason=message.reason or "shutdown", source="shutdown"), Close(code=1000)]

    # -- what the consumer learned --------------------------------------------------

    def call_started(
        self, *, call_id: str, request_id: str, job_id: str, progress_token: str | int | None
    ) -> None:
        """The job exists: the call is in flight until `finish`."""
        self._calls[call_id] = InFlight(
            call_id=call_id, request_id=request_id, job_id=job_id, progress_token=progress_token
        )

    def in_flight(self, call_id: str) -> InFlight | None:
        """The in-flight call, if it has not been answered."""
        return self._calls.get(call_id)

    def in_flight_calls(self) -> list[InFlight]:
        """Every call not answered yet."""
        return list(self._calls.values())

    def finish(self, call_id: str) -> InFlight | None:
        """Take the call out of the table; only the first caller gets it (and answers)."""
        return self._calls.pop(call_id, None)


def _type_of(message: Message) -> str:
    return {
        Initialize: "initialize",
        CallRequest: "capabilities/call",
        CancelRequest: "capabilities/cancel",
        Shutdown: "shutdown",
        ElicitationResponse: "elicitation/response",
    }[type(message)]
