"""One connection's ABP session, sans I/O: messages and facts in, actions out.

The shell (capabilities/transport/consumer.py) decodes frames and hands them to
`receive`, performs the actions it gets back in order, and reports what the I/O
found (`opened`, `call_started`, `cancels_settled`, `result_claimed`, ...) to the
method each action names, performing those actions before going on. Every envelope
is written here, and every decision about a call's outcome is taken here.

A call leaves the table of calls in flight exactly once (`_finish`), which is what
makes every call answered at most once by this connection; claims in the database
make it once across the session's connections.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from capabilities.protocol import (
    PROTOCOL_VERSION,
    CallRequest,
    CancelPendingRequest,
    CancelRequest,
    ElicitationResponse,
    ErrorCode,
    Initialize,
    ListCapabilities,
    Message,
    ProtocolError,
    RequestId,
    Shutdown,
    WireError,
    replies,
    responses,
)
from capabilities.protocol.closes import (
    CLOSE_CODES,
    REFUSAL_MESSAGES,
    TOO_MANY_SESSIONS_CLOSE_CODE,
    WITHDRAWN_BECAUSE,
)
from capabilities.session.actions import (
    Action,
    AnnounceTakeover,
    CallRecord,
    CancelFound,
    CancelStart,
    ClaimResult,
    Close,
    DeliverFound,
    Detach,
    EndAll,
    EndSession,
    FindUnanswered,
    GiveBack,
    LetGo,
    Limits,
    LookUp,
    OpenSession,
    ResumeSession,
    Send,
    SettleCancels,
    StartCall,
    StartTimer,
    StopTimer,
    StopTimers,
    StopWork,
    Then,
)
from capabilities.session.wire import Wire

TAKEN_OVER_CLOSE_CODE = 4409


class ConnectionState(Enum):
    """Where the connection and its session are."""

    CONNECTING = "connecting"
    """The credential is being checked."""
    REFUSED = "refused"
    """Refused: frames are dropped; the close is on its way."""
    NEW = "new"
    """Accepted; waiting for initialize."""
    OPEN = "open"
    """Holds its session."""
    GONE = "gone"
    """The socket is gone; the disconnect is on its way. Results are left for a resume."""
    SUPERSEDED = "superseded"
    """Another connection resumed the session; this socket is closing."""
    ENDING = "ending"
    """Shut down or key revoked: answering the last calls, then closing."""
    DETACHED = "detached"
    """Dropped; the session waits for a resume elsewhere."""
    CLOSED = "closed"
    """Over."""


Claimed = dict[str, Any] | str
STILL_ACTIVE = "still-active"
DELIVERED_ELSEWHERE = "delivered-elsewhere"

# Frames are still handled in these: the session is open, whatever its socket does.
_HANDLES_FRAMES = frozenset(
    {ConnectionState.OPEN, ConnectionState.GONE, ConnectionState.SUPERSEDED}
)


@dataclass(frozen=True, kw_only=True)
class InFlight:
    """A call this connection answers, not answered yet."""

    call_id: str
    request_id: RequestId
    job_id: str
    progress_token: str | int | None
    started: float
    """On the session's clock, when the call's job was written."""
    own: bool
    """Asked on this connection (not adopted from another of the session's)."""


class Session:
    """One connection's ABP session."""

    def __init__(
        self,
        *,
        capability_names: Callable[[], list[str]],
        app: dict[str, Any],
        wire: Wire = replies,
        describe: Callable[[], list[dict[str, Any]]] = list,
        shown: Callable[[str], bool] = lambda name: True,
        availability: Callable[[], dict[str, bool]] = dict,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        new_token: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = ConnectionState.CONNECTING
        self.session_id: str | None = None
        self.generation = 0
        self.notifications = False
        self.limits = Limits()
        self._capability_names = capability_names
        # What the agent is shown of them, in `initialize-result` and `capabilities/list`
        # (a call to another is still checked, and refused with the reason, by the start).
        self._shown = shown
        self._wire = wire
        self._describe = describe
        self._availability = availability
        self._app = app
        self._new_id = new_id
        self._new_token = new_token
        self._clock = clock
        self._calls: dict[str, InFlight] = {}
        # Calls whose job the shell is still writing: a cancel may overtake them.
        self._starting: dict[str, StartCall] = {}
        # This connection's calls in flight by their request id (as stored): what
        # `$/cancel_request` names, and what may not be reused meanwhile.
        self._call_of_request: dict[str, str] = {}
        # Calls answered again by a resume without a claim (their old connection had
        # claimed them): if that connection then gives the result back, it is claimed
        # here, not sent twice.
        self._answered_again: set[str] = set()
        self._initialize: Initialize | None = None

    # -- the connection ------------------------------------------------------------

    def accepted(self, limits: Limits) -> list[Action]:
        """The credential is good: the connection waits for initialize."""
        self.state, self.limits = ConnectionState.NEW, limits
        return []

    def refuse(self, reason: str) -> list[Action]:
        """Say why in a `notifications/error` (Daphne drops close reasons), then close."""
        self.state = ConnectionState.REFUSED
        return self._refusal(reason)

    def _refusal(self, reason: str) -> list[Action]:
        code = CLOSE_CODES[reason]
        error = WireError(
            code=ErrorCode.PERMISSION_DENIED,
            message=REFUSAL_MESSAGES[reason],
            retryable=reason == "expired-credentials",
            details={"reason": reason, "closeCode": code},
        )
        return [Send(text=self._wire.refusal(error)), Close(code=code)]

    def socket_gone(self) -> list[Action]:
        """A send found the socket closed, or the shell closed it."""
        if self.state is ConnectionState.OPEN:
            self.state = ConnectionState.GONE
        elif self.state is ConnectionState.ENDING:
            self.state = ConnectionState.CLOSED
        return []

    def send_dropped(self, claims: str | None) -> list[Action]:
        """A frame was not sent: a result claimed for it goes back to the session."""
        self.socket_gone()
        return [GiveBack(job_id=claims)] if claims is not None else []

    def disconnected(self, code: int) -> list[Action]:
        """The socket closed: detach for a resume, or end the session and its calls."""
        state, self.state = self.state, ConnectionState.CLOSED
        if state in (ConnectionState.OPEN, ConnectionState.GONE):
            assert self.session_id is not None
            if self.limits.resumable:
                self.state = ConnectionState.DETACHED
                self._forget_calls()  # they are the resuming connection's to answer
                return [
                    StopTimers(),
                    Detach(session_id=self.session_id, generation=self.generation),
                ]
            ending = self._settle_all("disconnect", "connection closed", delivered=False)
            self._forget_calls()  # answered by nobody: the session ends with its socket
            return [
                *ending,
                StopTimers(),
                EndSession(session_id=self.session_id, reason=f"disconnected ({code})"),
            ]
        return [StopTimers()]

    def key_revoked(self, reason: str = "key-revoked") -> list[Action]:
        """Access was withdrawn (`reason`: its key revoked, its user deactivated): end its
        calls, refuse, close."""
        if self.state is ConnectionState.NEW:
            return self.refuse(reason)
        if self.state is not ConnectionState.OPEN:
            return []
        assert self.session_id is not None
        self.state = ConnectionState.ENDING
        because = WITHDRAWN_BECAUSE[reason]
        ending = FindUnanswered(then=EndAll(source="operator", reason=because))
        return [
            ending,
            *self._refusal(reason),
            EndSession(session_id=self.session_id, reason=because),
        ]

    def superseded(self, generation: int) -> list[Action]:
        """Another connection resumed the session: let it go and close this socket."""
        if (
            generation <= self.generation
            or not self._live()
            or self.state is ConnectionState.SUPERSEDED
        ):
            return []  # our own announcement, an older one, or one already heard
        # Frames this socket already brought in are still handled: a call the agent
        # sent just before it resumed elsewhere is created, and its result goes to
        # the new holder.
        self.state = ConnectionState.SUPERSEDED
        return [LetGo(), StopTimers(), Close(code=TAKEN_OVER_CLOSE_CODE)]

    # -- messages in -----------------------------------------------------------------

    def receive(self, message: Message | ProtocolError) -> list[Action]:
        """What to do about one decoded frame (or one that failed to decode)."""
        if self.state is not ConnectionState.NEW and self.state not in _HANDLES_FRAMES:
            return []
        if isinstance(message, ProtocolError):
            return self._refuse_frame(message)
        if message.id is None:  # a notification: never answered
            return self._notice(message) if self.state is not ConnectionState.NEW else []
        if self._wire.UNIQUE_REQUEST_IDS and self._wire.store_id(message.id) in (
            self._call_of_request
        ):
            error = WireError(
                code=ErrorCode.INVALID_REQUEST,
                message="This request id is still in flight; use another.",
                details={"path": "id"},
            )
            return [Send(text=self._wire.error_for(_type_of(message), message.id, error))]
        if isinstance(message, Initialize):
            return self._initialize_message(message)
        if self.state is ConnectionState.NEW:
            return [Send(text=self._wire.not_initialized(_type_of(message), message.id))]
        if isinstance(message, CallRequest):
            return self._call(message)
        if isinstance(message, CancelRequest):
            return self._cancel(message)
        if isinstance(message, Shutdown):
            return self._shutdown(message)
        if isinstance(message, ListCapabilities):
            entries = [entry for entry in self._describe() if self._shown(entry["name"])]
            return [Send(text=self._wire.capability_list(message.id, entries))]
        assert isinstance(message, ElicitationResponse)
        error = WireError(code=ErrorCode.INVALID_PARAMS, message="No elicitation is pending.")
        return [Send(text=self._wire.error_for("elicitation/response", message.id, error))]

    def _notice(self, message: Message) -> list[Action]:
        """A notification: `$/cancel_request`, or a shutdown sent as one."""
        if isinstance(message, CancelPendingRequest):
            return self._cancel_pending_request(message)
        assert isinstance(message, Shutdown)
        return self._shutdown(message)

    def _refuse_frame(self, error: ProtocolError) -> list[Action]:
        wire = self._wire
        if self.state is ConnectionState.NEW and error.request_type not in (None, "initialize"):
            return [Send(text=wire.not_initialized(error.request_type, error.request_id))]
        return [Send(text=wire.error_for(error.request_type, error.request_id, error.error))]

    def _initialize_message(self, message: Initialize) -> list[Action]:
        if self.state is not ConnectionState.NEW or self._initialize is not None:
            error = WireError(
                code=ErrorCode.ALREADY_INITIALIZED, message="This connection is initialized."
            )
            return [Send(text=self._wire.error_for("initialize", message.id, error))]
        if message.resume is not None:
            if not self.limits.resumable:
                error = WireError(
                    code=ErrorCode.SESSION_INVALID, message="Sessions cannot be resumed here."
                )
                return [Send(text=self._wire.error_for("initialize", message.id, error))]
            self._initialize = message
            resume = message.resume
            return [
                ResumeSession(
                    session_id=resume.session_id, token=resume.token, awaiting=resume.awaiting
                )
            ]
        self._initialize = message
        return [
            OpenSession(session_id=self._new_id(), message=message, resume_token=self._new_token())
        ]

    def opened(self, action: OpenSession) -> list[Action]:
        """The session is recorded and held here."""
        return [Send(text=self._open(action.session_id, action.resume_token))]

    def open_refused(self, error: WireError) -> list[Action]:
        """Over the principal's open sessions: refuse, close; later frames are dropped."""
        assert self._initialize is not None
        self.state = ConnectionState.REFUSED
        return [
            Send(text=self._wire.error_for("initialize", self._initialize.id, error)),
            Close(code=TOO_MANY_SESSIONS_CLOSE_CODE),
        ]

    def resumed(
        self,
        action: ResumeSession,
        *,
        token: str,
        generation: int,
        was_held: bool,
        calls: list[CallRecord],
        again: Sequence[tuple[CallRecord, dict[str, Any]]] = (),
    ) -> list[Action]:
        """The session was taken over: its unanswered calls are this connection's.

        `again`: calls the agent still awaits whose results were sent on a socket that
        died unread; they are sent once more (the agent drops a second copy).
        """
        self.generation = generation
        actions: list[Action] = []
        if was_held:
            # Its old connection may linger (a half-open socket, another Daphne).
            actions.append(AnnounceTakeover(session_id=action.session_id, generation=generation))
        # A call can be in both lists: read unanswered, then claimed by a lingering old
        # connection before `again` was read. Sent once, as an answer again; its claim,
        # should that connection give it back, is then taken without sending.
        sent_again = {call.call_id for call, _ in again}
        both = [call for call in calls if call.call_id in sent_again]
        calls = [call for call in calls if call.call_id not in sent_again]
        held = [call.call_id for call in calls] + [call.call_id for call, _ in again]
        actions.append(Send(text=self._open(action.session_id, token, held_calls=held)))
        for call in calls:
            actions += self._adopt(call)
            if not call.active:
                actions += self._deliver(call.call_id, None)
        for call, response in again:
            request_id = self._wire.load_id(call.request_id)
            actions.append(Send(text=self._wire.call_result(request_id, response, own=False)))
            self._answered_again.add(call.call_id)
        for call in both:
            actions.append(ClaimResult(call_id=call.call_id, job_id=call.job_id, response=None))
        return actions

    def resume_refused(self, error: WireError) -> list[Action]:
        """The session could not be resumed; the connection may still initialize afresh."""
        assert self._initialize is not None
        request_id, self._initialize = self._initialize.id, None
        return [Send(text=self._wire.error_for("initialize", request_id, error))]

    def _open(self, session_id: str, token: str, *, held_calls: list[str] | None = None) -> str:
        message = self._initialize
        assert message is not None
        self.state, self.session_id = ConnectionState.OPEN, session_id
        self.notifications = message.features.notifications
        return self._wire.initialize_result(
            message.id,
            session_id=session_id,
            protocol_version=PROTOCOL_VERSION,
            app=self._app,
            capabilities=self._capabilities(self._availability()),
            features={
                "notifications": message.features.notifications,
                "progress": message.features.progress,
                "elicitation": False,
            },
            resume_token=token,
            held_calls=held_calls,
        )

    def _capabilities(self, available: dict[str, bool]) -> list[dict[str, Any]]:
        """`[{name, available}]`: whether a live worker can run each capability now."""
        return [
            {"name": name, "available": available.get(name, True)}
            for name in self._capability_names()
            if self._shown(name)
        ]

    def capabilities_changed(self, available: dict[str, bool]) -> list[Action]:
        """Workers came or went: tell the agent, if it wants notifications."""
        if self.state is not ConnectionState.OPEN or not self.notifications:
            return []
        data = {"capabilities": self._capabilities(available)}
        return [Send(text=self._wire.notification("notifications/capabilities/changed", data))]

    # -- calls -------------------------------------------------------------------------

    def _call(self, message: CallRequest) -> list[Action]:
        call_id = message.options.call_id or self._new_id()
        resent = message.options.resent and message.options.call_id is not None
        if resent and (call_id in self._calls or call_id in self._starting):
            return []  # its first copy arrived after all: that one is answered
        error = self._call_refusal(message, call_id)
        if error is not None:
            return [Send(text=self._wire.call_error(message.id, call_id, error))]
        start = StartCall(
            request_id=message.id,
            stored_request_id=self._wire.store_id(message.id),
            call_id=call_id,
            capability=message.capability,
            params=message.params,
            timeout_ms=message.options.timeout_ms,
            progress_token=message.options.progress_token,
            notify_started=self.notifications,
            resent=resent,
        )
        self._starting[call_id] = start
        self._call_of_request[start.stored_request_id] = call_id
        return [start]

    def _call_refusal(self, message: CallRequest, call_id: str) -> WireError | None:
        if call_id in self._calls or call_id in self._starting:
            return WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"callId {call_id!r} is already running in this session.",
                details={"path": "payload.options.callId"},
            )
        if message.capability not in self._capability_names():
            return responses.unknown_capability(message.capability)
        limit = self.limits.max_timeout_ms
        max_timeout_ms = None if limit is None else limit(message.capability)
        if max_timeout_ms is not None and (message.options.timeout_ms or 0) > max_timeout_ms:
            return WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"options.timeout may be at most {max_timeout_ms} ms "
                f"for {message.capability}.",
                details={"path": "payload.options.timeout", "max": max_timeout_ms},
            )
        most = self.limits.max_queued_calls
        if most is not None and len(self._calls) + len(self._starting) >= most:
            wait_ms = self.limits.queue_full_retry_after_ms
            return WireError(
                code=ErrorCode.RATE_LIMITED,
                message=f"At most {most} calls may be queued or running in one session; "
                "wait for one to finish.",
                retry_after_ms=wait_ms,
                details={"limit": "queuedCalls", "max": most},
            )
        return None

    def call_started(self, call: CallRecord) -> list[Action]:
        """The job exists: the call is in flight until answered."""
        if self._starting.pop(call.call_id, None) is None:
            return []  # cancelled before its row was written, which says so; answered
        return self._adopt(call, own=True)

    def call_refused(self, action: StartCall, error: WireError) -> list[Action]:
        """The call service would not start the call."""
        if self._starting.pop(action.call_id, None) is None:
            return []  # cancelled first, and answered then
        self._call_of_request.pop(action.stored_request_id, None)
        return [Send(text=self._wire.call_error(action.request_id, action.call_id, error))]

    def resent_call_held(self, action: StartCall) -> list[Action]:
        """A re-sent call's callId is the session's already (its first copy came in
        on the old socket after all): adopt that call instead of running it twice."""
        if self._starting.pop(action.call_id, None) is None:
            return []
        self._call_of_request.pop(action.stored_request_id, None)
        return [LookUp(call_id=action.call_id, then=DeliverFound())]

    def start_cancelled(self, action: CancelStart) -> list[Action]:
        """The cancel came before the call's job was written: the job is written
        settled (cancelled, delivered) and never runs, so both answers go now."""
        start = self._starting.pop(action.call_id, None)
        if start is None:
            return []
        self._call_of_request.pop(start.stored_request_id, None)
        actions: list[Action] = []
        if isinstance(action.message, CancelRequest):
            reply = self._wire.cancel_result(action.message.id, start.call_id, cancelled=True)
            actions.append(Send(text=reply))
        result = responses.cancelled(start.call_id, "agent", 0)
        return [
            *actions,
            *self._completed(start.call_id),
            Send(text=self._wire.call_result(start.request_id, result, own=True)),
        ]

    def _adopt(self, call: CallRecord, *, own: bool = False, timer: bool = True) -> list[Action]:
        """Make a call this connection's to answer (and, while it runs, to time out)."""
        self._calls[call.call_id] = InFlight(
            call_id=call.call_id,
            request_id=self._wire.load_id(call.request_id),
            job_id=call.job_id,
            progress_token=call.progress_token,
            started=self._clock() - call.age_seconds,
            own=own,
        )
        if own:
            self._call_of_request[call.request_id] = call.call_id
        if call.active and timer:
            return [StartTimer(call_id=call.call_id, seconds=max(0.0, call.seconds_left))]
        return []

    def _finish(self, call_id: str) -> InFlight | None:
        """Take the call out of the table; only the first caller gets it (and answers)."""
        call = self._calls.pop(call_id, None)
        if call is not None and call.own:
            self._call_of_request.pop(self._wire.store_id(call.request_id), None)
        return call

    def _forget_calls(self) -> None:
        """Let every call go unanswered here (the session's other connections answer)."""
        self._calls.clear()
        self._starting.clear()
        self._call_of_request.clear()

    def _live(self) -> bool:
        """Whether the session still acts on its calls here."""
        return self.state in _HANDLES_FRAMES or self.state is ConnectionState.ENDING

    def in_flight(self, call_id: str) -> InFlight | None:
        """The call, if this connection holds it unanswered."""
        return self._calls.get(call_id)

    def answers(self, call_id: str) -> bool:
        """Whether this connection would send the call's result now, were it settled."""
        return call_id in self._calls and self.state is ConnectionState.OPEN

    # -- cancels ----------------------------------------------------------------------

    def _cancel(self, message: CancelRequest) -> list[Action]:
        reason = message.reason or ""
        start = self._starting.get(message.call_id)
        if start is not None:
            return [self._cancel_start(start, reason, message)]
        call = self._calls.get(message.call_id)
        if call is None:
            then = CancelFound(request_id=message.id, reason=reason)
            return [LookUp(call_id=message.call_id, then=then)]
        return [self._settle_agent_cancel(call, message.id, reason)]

    @staticmethod
    def _cancel_start(
        start: StartCall, reason: str, message: CancelRequest | CancelPendingRequest
    ) -> CancelStart:
        return CancelStart(
            call_id=start.call_id, reason=reason, message=message, overtakes=not start.resent
        )

    def _cancel_pending_request(self, message: CancelPendingRequest) -> list[Action]:
        """`$/cancel_request`: cancel the call a request of this connection made.

        Unconfirmed: the request itself is answered, -32800 if this cancel settled its
        job first, else with its result. An unknown or answered id is ignored.
        """
        call_id = self._call_of_request.get(self._wire.store_id(message.request_id))
        if call_id is None or self.state is not ConnectionState.OPEN:
            return []
        start = self._starting.get(call_id)
        if start is not None:
            return [self._cancel_start(start, "$/cancel_request", message)]
        call = self._calls.get(call_id)
        if call is None:
            return []
        return [
            SettleCancels(
                call_ids=(call.call_id,),
                job_ids=(call.job_id,),
                source="agent",
                reason="$/cancel_request",
                delivered=True,
            )
        ]

    @staticmethod
    def _settle_agent_cancel(call: InFlight, request_id: RequestId, reason: str) -> SettleCancels:
        return SettleCancels(
            call_ids=(call.call_id,),
            job_ids=(call.job_id,),
            source="agent",
            reason=reason,
            delivered=True,
            request_id=request_id,
            read_losers=True,
        )

    def timed_out(self, call_id: str) -> list[Action]:
        """The call's deadline passed."""
        call = self._calls.get(call_id) if self._live() else None
        if call is None:
            return []
        return [
            SettleCancels(
                call_ids=(call_id,),
                job_ids=(call.job_id,),
                source="timeout",
                reason="options.timeout",
                delivered=True,
            )
        ]

    def _shutdown(self, message: Shutdown) -> list[Action]:
        assert self.session_id is not None
        reason = message.reason or "shutdown"
        self.state = (
            ConnectionState.ENDING if self.state is ConnectionState.OPEN else ConnectionState.CLOSED
        )
        answer = self._wire.shutdown_result(message.id)
        return [
            EndSession(session_id=self.session_id, reason=f"shutdown: {reason}"),
            FindUnanswered(then=EndAll(source="shutdown", reason=reason)),
            *([Send(text=answer)] if answer is not None else []),
            Close(code=1000),
        ]

    def unanswered(self, then: EndAll, calls: list[CallRecord]) -> list[Action]:
        """Every unanswered call of the session: hold them all, then end them all.

        Besides this connection's own calls, the session may have some that another
        of its connections created or gave back a moment ago.
        """
        if self.state is ConnectionState.ENDING:
            for call in calls:
                if call.call_id not in self._calls:
                    self._adopt(call, timer=False)
        return self._settle_all(then.source, then.reason, delivered=True)

    def _settle_all(self, source: str, reason: str, *, delivered: bool) -> list[Action]:
        calls = list(self._calls.values())
        if not calls:
            return []
        return [
            SettleCancels(
                call_ids=tuple(call.call_id for call in calls),
                job_ids=tuple(call.job_id for call in calls),
                source=source,
                reason=reason,
                delivered=delivered,
            )
        ]

    def cancels_settled(
        self,
        action: SettleCancels,
        won: dict[str, bool],
        losers: dict[str, dict[str, Any] | None] | None = None,
    ) -> list[Action]:
        """Which settles won: winners are answered and stopped, losers delivered."""
        actions: list[Action] = []
        for call_id, job_id in zip(action.call_ids, action.job_ids, strict=True):
            if won[job_id]:
                actions += self._won(action, call_id, job_id)
            elif action.request_id is not None:
                response = (losers or {}).get(job_id)
                was_cancelled = bool(response and response.get("cancelled"))
                reply = self._wire.cancel_result(
                    action.request_id,
                    call_id,
                    cancelled=was_cancelled,
                    reason=None if was_cancelled else replies.ALREADY_COMPLETED,
                )
                actions += [Send(text=reply), *self._deliver(call_id, response)]
            elif action.delivered:
                actions += self._deliver(call_id, None)
        return actions

    def _won(self, action: SettleCancels, call_id: str, job_id: str) -> list[Action]:
        if not action.delivered:  # nobody to tell: the socket is gone
            self._finish(call_id)
            return [StopTimer(call_id=call_id), StopWork(job_id=job_id)]
        actions: list[Action] = []
        if action.request_id is not None:
            reply = self._wire.cancel_result(action.request_id, call_id, cancelled=True)
            actions.append(Send(text=reply))
        call = self._finish(call_id)
        if call is None:
            return actions
        duration = int((self._clock() - call.started) * 1000)
        result = responses.cancelled(call_id, action.source, duration)
        return [
            *actions,
            StopTimer(call_id=call_id),
            *self._completed(call_id),
            Send(text=self._wire.call_result(call.request_id, result, own=call.own), claims=job_id),
            StopWork(job_id=job_id),
        ]

    # -- results ----------------------------------------------------------------------

    def _deliver(self, call_id: str, response: dict[str, Any] | None) -> list[Action]:
        call = self._calls.get(call_id)
        if call is None:
            return []  # answered already: a late note
        if self.state not in (ConnectionState.OPEN, ConnectionState.ENDING):
            # Claiming it now would only keep it from the connection that resumes
            # the session; unclaimed, that connection finds it.
            return []
        return [ClaimResult(call_id=call_id, job_id=call.job_id, response=response)]

    def result_claimed(self, action: ClaimResult, claimed: Claimed) -> list[Action]:
        """The claim's outcome: send the result, or not."""
        if claimed == STILL_ACTIVE:
            return []  # a stale note: the job runs on
        call = self._finish(action.call_id)
        if call is None:
            return []
        if not isinstance(claimed, dict):
            return [StopTimer(call_id=call.call_id)]  # sent by another connection
        return [
            StopTimer(call_id=call.call_id),
            *self._completed(call.call_id),
            Send(
                text=self._wire.call_result(call.request_id, claimed, own=call.own),
                claims=call.job_id,
            ),
        ]

    def _completed(self, call_id: str) -> list[Action]:
        if not self.notifications:
            return []
        note = self._wire.notification(
            "notifications/operation/completed", {"operationId": call_id}
        )
        return [Send(text=note)]

    def found(self, action: LookUp, call: CallRecord | None) -> list[Action]:
        """A lookup's answer: adopt the call if it is unanswered, then carry on."""
        then: Then = action.then
        actions: list[Action] = []
        if (
            isinstance(then, DeliverFound)
            and call is not None
            and not call.delivered  # given back by the connection that claimed it
            and call.call_id in self._answered_again
        ):
            self._answered_again.discard(call.call_id)
            # Sent by the resume already: claimed, so that nobody sends it again.
            return [ClaimResult(call_id=call.call_id, job_id=call.job_id, response=None)]
        held = self._calls.get(call.call_id) if call is not None else None
        unanswered = call is not None and held is None and not call.delivered
        if unanswered and self.state is ConnectionState.OPEN:
            assert call is not None
            actions = self._adopt(call)
            held = self._calls[call.call_id]
        if isinstance(then, DeliverFound):
            # Not held: answered already, or not this connection's.
            return [*actions, *self._deliver(held.call_id, then.response)] if held else []
        if held is not None:
            return [*actions, self._settle_agent_cancel(held, then.request_id, then.reason)]
        if call is None:
            cancelled, reason = False, replies.NOT_FOUND
        elif call.status == "cancelled":
            cancelled, reason = True, None
        else:
            cancelled, reason = False, replies.ALREADY_COMPLETED
        assert action.call_id is not None  # a cancel looks its call up by id
        reply = self._wire.cancel_result(
            then.request_id, action.call_id, cancelled=cancelled, reason=reason
        )
        return [Send(text=reply)]

    # -- notes from workers, the reaper and the admin -----------------------------------

    def job_started(self, call_id: str) -> list[Action]:
        """The worker started the call."""
        if not self.notifications or call_id not in self._calls or not self._live():
            return []
        note = self._wire.notification("notifications/operation/started", {"operationId": call_id})
        return [Send(text=note)]

    def job_progress(
        self,
        call_id: str,
        *,
        progress: float,
        total: float | None,
        stage: str,
        position: int | None = None,
    ) -> list[Action]:
        """The call made progress (or moved up the line): tell the agent if it asked."""
        call = self._calls.get(call_id) if self._live() else None
        if call is None or call.progress_token is None:
            return []
        reply = self._wire.progress(
            call.progress_token,
            call_id=call_id,
            progress=progress,
            total=total,
            stage=stage,
            position=position,
        )
        return [Send(text=reply)]

    def job_settled(self, call_id: str, response: dict[str, Any] | None) -> list[Action]:
        """The call's job settled somewhere: deliver it, finding it first if need be."""
        if call_id in self._calls:
            return self._deliver(call_id, response)
        if self.state is not ConnectionState.OPEN:
            return []
        return [LookUp(call_id=call_id, then=DeliverFound(response=response))]

    def job_returned(self, job_id: str) -> list[Action]:
        """A result its connection gave back (or nobody sent): take it over."""
        if self.state is not ConnectionState.OPEN:
            return []  # a resume will find it
        return [LookUp(job_id=job_id, then=DeliverFound())]


def _type_of(message: Message) -> str:
    return {
        Initialize: "initialize",
        CallRequest: "capabilities/call",
        CancelRequest: "capabilities/cancel",
        Shutdown: "shutdown",
        ElicitationResponse: "elicitation/response",
        ListCapabilities: "capabilities/list",
        CancelPendingRequest: "$/cancel_request",
    }[type(message)]
