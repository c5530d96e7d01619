"""One connection's ABP session, sans I/O: messages and facts in, actions out.

The shell (capabilities/transport/consumer.py) decodes frames and hands them to
`receive`, performs the actions it gets back in order, and reports what the I/O
found (`opened`, `call_started`, `cancels_settled`, `result_claimed`, ...) to the
method each action names, performing those actions before going on; then it asks
`replay` for the events held meanwhile. Every envelope is written here, and every
decision about a call's outcome is taken here.

Each call moves through the phases of one table (capabilities/session/calls.py).
An event a call's phase does not take yet (a cancel while its row is being
written, a note before its start is reported) is held here and replayed in order,
so the shell never waits on a call's behalf. A call leaves the table once, which
makes it answered at most once by this connection; claims fenced by the session's
generation make it once per connection in the database.
"""

from __future__ import annotations

import functools
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
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
from capabilities.protocol.call_digest import call_digest
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
from capabilities.session.calls import (
    STARTS,
    Call,
    CallTable,
    Cancel,
    Event,
    Held,
    Phase,
    Step,
    Wait,
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
Replay = Callable[[], list[Action]]
STILL_ACTIVE = "still-active"
DELIVERED_ELSEWHERE = "delivered-elsewhere"

# Frames are still handled in these: the session is open, whatever its socket does.
_HANDLES_FRAMES = frozenset(
    {ConnectionState.OPEN, ConnectionState.GONE, ConnectionState.SUPERSEDED}
)


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
        self.calls = CallTable()
        # Set while a held event is replayed: it goes, whatever else is held.
        self._replaying = False
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
        if self._waits_for_starts(lambda: self.disconnected(code)):
            return []
        state, self.state = self.state, ConnectionState.CLOSED
        if state in (ConnectionState.OPEN, ConnectionState.GONE):
            assert self.session_id is not None
            if self.limits.resumable:
                self.state = ConnectionState.DETACHED
                self.calls.clear()  # they are the resuming connection's to answer
                return [
                    StopTimers(),
                    Detach(session_id=self.session_id, generation=self.generation),
                ]
            ending = self._settle_all("disconnect", "connection closed", delivered=False)
            self.calls.clear()  # answered by nobody: the session ends with its socket
            return [
                *ending,
                StopTimers(),
                EndSession(session_id=self.session_id, reason=f"disconnected ({code})"),
            ]
        return [StopTimers()]

    def key_revoked(self, reason: str = "key-revoked") -> list[Action]:
        """Access was withdrawn (`reason`: its key revoked, its user deactivated): end its
        calls, refuse, close."""
        if self._waits_for_starts(lambda: self.key_revoked(reason)):
            return []
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
        if self._waits_for_starts(lambda: self.superseded(generation)):
            return []
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

    # -- events held for later ---------------------------------------------------------

    def replay(self) -> list[Action] | None:
        """The next held event that may go now, handled; None if none may.

        The shell asks after performing the actions of each event (and their reports),
        until None: held events are then handled in order, each in full.
        """
        held = self.calls.next_ready()
        if held is None:
            return None
        self._replaying = True
        try:
            return held.replay()
        finally:
            self._replaying = False

    def _held_back(self, wait: Wait, blocked: Callable[[], bool], replay: Replay) -> bool:
        """Hold the event if it must wait (for its call, the starts, or earlier events)."""
        if self._replaying:
            self._replaying = False  # the replayed event itself goes
            return False
        if not self.calls.must_hold(wait, blocked()):
            return False
        self.calls.hold(Held(wait=wait, blocked=blocked, replay=replay))
        return True

    def _waits_for_starts(self, replay: Replay) -> bool:
        """Hold an event about the whole session until no call is starting."""
        return self._held_back(Wait.BARRIER, self.calls.starting, replay)

    def _waits_for_call(self, call_id: str, event: Event, replay: Replay) -> bool:
        """Hold an event about one call until its phase takes it."""
        return self._held_back(Wait.NOTE, lambda: self._phase_holds(call_id, event), replay)

    def _phase_holds(self, call_id: str | None, event: Event) -> bool:
        call = self.calls.get(call_id)
        return call is not None and self.calls.holds(call, event)

    def _frame_waits(self, message: Message | ProtocolError) -> tuple[Wait, Callable[[], bool]]:
        """How an agent's frame waits: for its call's phase, or for every start."""
        if isinstance(message, CallRequest):
            call_id = message.options.call_id
            return Wait.FRAME, lambda: self._phase_holds(call_id, Event.ASKED)
        if isinstance(message, CancelRequest):
            return Wait.FRAME, lambda: self._phase_holds(message.call_id, Event.CANCEL)
        if isinstance(message, CancelPendingRequest):
            return Wait.FRAME, lambda: self._phase_holds(
                self._call_of_request(message.request_id), Event.CANCEL
            )
        return Wait.BARRIER, self.calls.starting

    def _call_of_request(self, request_id: RequestId) -> str | None:
        call = self.calls.by_request(self._wire.store_id(request_id))
        return call.call_id if call is not None else None

    # -- messages in -----------------------------------------------------------------

    def receive(self, message: Message | ProtocolError) -> list[Action]:
        """What to do about one decoded frame (or one that failed to decode)."""
        if self.state is not ConnectionState.NEW and self.state not in _HANDLES_FRAMES:
            return []
        wait, blocked = self._frame_waits(message)
        if self._held_back(wait, blocked, lambda: self.receive(message)):
            return []
        if isinstance(message, ProtocolError):
            return self._refuse_frame(message)
        if message.id is None:  # a notification: never answered
            return self._notice(message) if self.state is not ConnectionState.NEW else []
        if self._wire.UNIQUE_REQUEST_IDS and self.calls.request_in_use(
            self._wire.store_id(message.id)
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
        # connection before `again` was read. It is sent once, as an answer again; the
        # resume claimed it for this generation, so no claim here sends it twice.
        sent_again = {call.call_id for call, _ in again}
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
        opened = replies.SessionOpened(
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
        return self._wire.initialize_result(message.id, opened)

    def _capabilities(self, available: dict[str, bool]) -> list[dict[str, Any]]:
        """`[{name, available}]`: whether a live worker can run each capability now."""
        return [
            {"name": name, "available": available.get(name, True)}
            for name in self._capability_names()
            if self._shown(name)
        ]

    def capabilities_changed(self, available: dict[str, bool]) -> list[Action]:
        """Workers came or went: tell the agent, if it wants notifications."""
        if self._waits_for_starts(lambda: self.capabilities_changed(available)):
            return []
        if self.state is not ConnectionState.OPEN or not self.notifications:
            return []
        data = {"capabilities": self._capabilities(available)}
        return [Send(text=self._wire.notification("notifications/capabilities/changed", data))]

    # -- calls -------------------------------------------------------------------------

    def _call(self, message: CallRequest) -> list[Action]:
        call_id = message.options.call_id or self._new_id()
        digest = call_digest(message.capability, message.params)
        resent = message.options.resent and message.options.call_id is not None
        held = self.calls.get(call_id)
        if held is not None:  # in flight here: its phase holds a call frame otherwise
            self.calls.on(held, Event.ASKED)
            if resent and held.digest == digest:
                return []  # that very call, sent again after a resume: answered once
            running = WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"callId {call_id!r} is already running in this session.",
                details={"path": "payload.options.callId"},
            )
            return [Send(text=self._wire.call_error(message.id, call_id, running))]
        error = self._call_refusal(message)
        if error is not None:
            return [Send(text=self._wire.call_error(message.id, call_id, error))]
        start = StartCall(
            request_id=message.id,
            stored_request_id=self._wire.store_id(message.id),
            call_id=call_id,
            capability=message.capability,
            params=message.params,
            params_hash=digest,
            timeout_ms=message.options.timeout_ms,
            progress_token=message.options.progress_token,
            notify_started=self.notifications,
            resent=resent,
        )
        self.calls.add(
            Call(
                call_id=call_id,
                request_id=message.id,
                stored_request_id=start.stored_request_id,
                phase=Phase.STARTING,
                digest=digest,
                resent=resent,
            )
        )
        return [start]

    def _call_refusal(self, message: CallRequest) -> WireError | None:
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
        if most is not None and len(self.calls) >= most:
            wait_ms = self.limits.queue_full_retry_after_ms
            return WireError(
                code=ErrorCode.RATE_LIMITED,
                message=f"At most {most} calls may be queued or running in one session; "
                "wait for one to finish.",
                retry_after_ms=wait_ms,
                details={"limit": "queuedCalls", "max": most},
            )
        return None

    # -- what a start reports ------------------------------------------------------------

    def call_started(self, call: CallRecord) -> list[Action]:
        """The start wrote the call's row: the call is in flight until answered."""
        return self._start_reported(call.call_id, Event.WRITTEN, record=call)

    def call_adopted(
        self, action: StartCall, call: CallRecord, again: dict[str, Any] | None = None
    ) -> list[Action]:
        """The start found this very call's row (the same callId and call), written by
        another copy of its frame: a re-sent call is that one, never run twice; one not
        marked re-sent reuses a callId (docs/protocol.md).

        `again`: its result, answered on an older connection's socket and now claimed
        for this one (the copy was re-sent: the agent awaits it), to send once more, as
        a resume sends the calls its agent awaits.
        """
        held = self.calls.get(action.call_id)
        if held is not None and not held.resent and held.phase in STARTS:
            if held.won_by is not None:  # it cancels the call that holds the callId
                self._hold_first(held.won_by)
                held.won_by = None
            return self._start_reported(action.call_id, Event.REFUSED, error=_used(held))
        actions = self._start_reported(action.call_id, Event.ADOPTED, record=call)
        if again is not None and held is not None and call.delivered:
            request_id = self._wire.load_id(call.request_id)
            actions.append(Send(text=self._wire.call_result(request_id, again, own=False)))
        return actions

    def call_refused(self, action: StartCall, error: WireError) -> list[Action]:
        """The call service would not start the call."""
        return self._start_reported(action.call_id, Event.REFUSED, error=error)

    def start_ticket(self, action: CancelStart, won: bool) -> list[Action]:
        """Whether the cancel came before the call's row was sealed."""
        call = self.calls.get(action.call_id)
        if call is None:
            return []
        step = self.calls.on(call, Event.TICKET_WON if won else Event.TICKET_LOST)
        if step is Step.CANCEL_WON:
            call.won_by = action.message  # answered once the cancelled row is written
        elif step is Step.CANCEL_WAITS:
            self._hold_first(action.message)
        return []

    def _hold_first(self, message: Message) -> None:
        """Hold a frame ahead of every held one (they all came after it)."""
        _, blocked = self._frame_waits(message)
        self.calls.hold(
            Held(wait=Wait.FRAME, blocked=blocked, replay=lambda: self.receive(message)),
            first=True,
        )

    def _start_reported(
        self,
        call_id: str,
        event: Event,
        *,
        record: CallRecord | None = None,
        error: WireError | None = None,
    ) -> list[Action]:
        call = self.calls.get(call_id)
        if call is None or call.phase not in STARTS:
            return []  # let go meanwhile (the socket dropped): a resume finds its row
        step = self.calls.on(call, event)
        if step is Step.ANSWER_CANCELLED:
            return self._answer_cancelled(call)
        if step is Step.REFUSE:
            assert error is not None
            return self._refuse_start(call, error)
        assert record is not None
        if step is Step.ADOPT_AND_CANCEL and call.won_by is not None:
            # The cancel won a copy whose call another copy wrote: it cancels that call.
            self._hold_first(call.won_by)
            call.won_by = None
        return self._in_flight(call, record)

    def _in_flight(self, call: Call, record: CallRecord) -> list[Action]:
        """The call's row is there: time the call, and deliver it if it settled already."""
        call.job_id, call.progress_token = record.job_id, record.progress_token
        call.started = self._clock() - record.age_seconds
        if record.delivered:  # adopted, and answered already: that call, answered once
            self.calls.on(call, Event.ANSWERED)
            return []
        if record.request_id != call.stored_request_id:  # adopted: answered as first asked
            call.request_id, call.own = self._wire.load_id(record.request_id), False
        if record.active:
            return [StartTimer(call_id=call.call_id, seconds=max(0.0, record.seconds_left))]
        return self._deliver(call.call_id, None)

    def _answer_cancelled(self, call: Call) -> list[Action]:
        """A cancel won the call's start, and its row is written cancelled and delivered:
        confirm the cancel, and answer the call."""
        actions: list[Action] = []
        if isinstance(call.won_by, CancelRequest):
            reply = self._wire.cancel_result(call.won_by.id, call.call_id, cancelled=True)
            actions.append(Send(text=reply))
        return [*actions, *self._cancelled_answer(call, "agent", 0)]

    def _refuse_start(self, call: Call, error: WireError) -> list[Action]:
        actions: list[Action] = [
            Send(text=self._wire.call_error(call.request_id, call.call_id, error))
        ]
        if isinstance(call.won_by, CancelRequest):  # the call ended refused, not cancelled
            reply = self._wire.cancel_result(
                call.won_by.id, call.call_id, cancelled=False, reason=replies.ALREADY_COMPLETED
            )
            actions.append(Send(text=reply))
        return actions

    def _adopt(self, call: CallRecord, *, own: bool = False, timer: bool = True) -> list[Action]:
        """Make a stored call this connection's to answer (and, while it runs, to time out)."""
        self.calls.add(
            Call(
                call_id=call.call_id,
                request_id=self._wire.load_id(call.request_id),
                stored_request_id=call.request_id,
                phase=Phase.IN_FLIGHT,
                own=own,
                digest=call.params_hash,
                job_id=call.job_id,
                progress_token=call.progress_token,
                started=self._clock() - call.age_seconds,
            )
        )
        if call.active and timer:
            return [StartTimer(call_id=call.call_id, seconds=max(0.0, call.seconds_left))]
        return []

    def _finish(self, call_id: str) -> Call | None:
        """Take the call out of the table; only the first caller gets it (and answers)."""
        call = self.calls.get(call_id)
        if call is None or call.phase is not Phase.IN_FLIGHT:
            return None
        self.calls.on(call, Event.ANSWERED)
        return call

    def _live(self) -> bool:
        """Whether the session still acts on its calls here."""
        return self.state in _HANDLES_FRAMES or self.state is ConnectionState.ENDING

    def in_flight(self, call_id: str) -> Call | None:
        """The call, if this connection holds it unanswered with its job written."""
        call = self.calls.get(call_id)
        return call if call is not None and call.phase is Phase.IN_FLIGHT else None

    def answers(self, call_id: str) -> bool:
        """Whether this connection would send the call's result now, were it settled."""
        return self.in_flight(call_id) is not None and self.state is ConnectionState.OPEN

    # -- cancels ----------------------------------------------------------------------

    def _cancel(self, message: CancelRequest) -> list[Action]:
        call = self.calls.get(message.call_id)
        if call is None:
            then = CancelFound(request_id=message.id, reason=message.reason or "")
            return [LookUp(call_id=message.call_id, then=then)]
        return self._cancel_call(call, message, message.reason or "")

    def _cancel_pending_request(self, message: CancelPendingRequest) -> list[Action]:
        """`$/cancel_request`: cancel the call a request of this connection made.

        Unconfirmed: the request itself is answered, -32800 if this cancel settled its
        job first, else with its result. An unknown or answered id is ignored.
        """
        call = self.calls.by_request(self._wire.store_id(message.request_id))
        if call is None or self.state is not ConnectionState.OPEN:
            return []
        return self._cancel_call(call, message, "$/cancel_request")

    def _cancel_call(self, call: Call, message: Cancel, reason: str) -> list[Action]:
        """An agent's cancel of a call this connection holds (not held back: calls.py)."""
        step = self.calls.on(call, Event.CANCEL)
        if step is Step.TRY_TICKET:
            return [CancelStart(call_id=call.call_id, reason=reason, message=message)]
        assert step is Step.SETTLE_CANCEL
        request_id = message.id if isinstance(message, CancelRequest) else None
        return [
            SettleCancels(
                call_ids=(call.call_id,),
                job_ids=(call.job_id,),
                source="agent",
                reason=reason,
                delivered=True,
                request_id=request_id,
                read_losers=request_id is not None,
            )
        ]

    def timed_out(self, call_id: str) -> list[Action]:
        """The call's deadline passed."""
        call = self.calls.get(call_id) if self._live() else None
        if call is None or self.calls.on(call, Event.DEADLINE) is not Step.SETTLE_TIMEOUT:
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
                if self.calls.get(call.call_id) is None:
                    self._adopt(call, timer=False)
        return self._settle_all(then.source, then.reason, delivered=True)

    def _settle_all(self, source: str, reason: str, *, delivered: bool) -> list[Action]:
        calls = self.calls.in_phase(Phase.IN_FLIGHT)
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
        duration_ms = int((self._clock() - call.started) * 1000)
        return [
            *actions,
            StopTimer(call_id=call_id),
            *self._cancelled_answer(call, action.source, duration_ms, claims=job_id),
            StopWork(job_id=job_id),
        ]

    def _cancelled_answer(
        self, call: Call, source: str, duration_ms: int, *, claims: str | None = None
    ) -> list[Action]:
        """The cancelled result of a call this connection answers, and its completion note."""
        result = responses.cancelled(call.call_id, source, duration_ms)
        text = self._wire.call_result(call.request_id, result, own=call.own)
        return [*self._completed(call.call_id), Send(text=text, claims=claims)]

    # -- results ----------------------------------------------------------------------

    def _deliver(self, call_id: str, response: dict[str, Any] | None) -> list[Action]:
        call = self.in_flight(call_id)
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
        held = self.in_flight(call.call_id) if call is not None else None
        unanswered = call is not None and held is None and not call.delivered
        if unanswered and self.state is ConnectionState.OPEN:
            assert call is not None
            if self.calls.get(call.call_id) is None:
                actions = self._adopt(call)
                held = self.in_flight(call.call_id)
        if isinstance(then, DeliverFound):
            # Not held: answered already, or not this connection's.
            return [*actions, *self._deliver(held.call_id, then.response)] if held else []
        if held is not None:
            cancel = CancelRequest(id=then.request_id, call_id=held.call_id, reason=then.reason)
            return [*actions, *self._cancel_call(held, cancel, then.reason)]
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
        if self._waits_for_call(call_id, Event.NOTE, lambda: self.job_started(call_id)):
            return []
        if not self.notifications or self._note_for(call_id) is None:
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
        again = functools.partial(
            self.job_progress,
            call_id,
            progress=progress,
            total=total,
            stage=stage,
            position=position,
        )
        if self._waits_for_call(call_id, Event.NOTE, again):
            return []
        call = self._note_for(call_id)
        if call is None or call.progress_token is None:
            return []
        report = replies.ProgressReport(
            operation_id=call.progress_token,
            call_id=call_id,
            progress=progress,
            total=total,
            stage=stage,
            position=position,
        )
        reply = self._wire.progress(report)
        return [Send(text=reply)]

    def job_settled(self, call_id: str, response: dict[str, Any] | None) -> list[Action]:
        """The call's job settled somewhere: deliver it, finding it first if need be."""
        if self._waits_for_call(call_id, Event.NOTE, lambda: self.job_settled(call_id, response)):
            return []
        if self._note_for(call_id) is not None:
            return self._deliver(call_id, response)
        if self.state is not ConnectionState.OPEN:
            return []
        return [LookUp(call_id=call_id, then=DeliverFound(response=response))]

    def _note_for(self, call_id: str) -> Call | None:
        """The call a worker's note is about, if this connection answers it now."""
        call = self.calls.get(call_id) if self._live() else None
        if call is None or self.calls.on(call, Event.NOTE) is not Step.FORWARD:
            return None
        return call

    def job_returned(self, job_id: str) -> list[Action]:
        """A result its connection gave back (or nobody sent): take it over."""
        if self._waits_for_starts(lambda: self.job_returned(job_id)):
            return []
        if self.state is not ConnectionState.OPEN:
            return []  # a resume will find it
        return [LookUp(job_id=job_id, then=DeliverFound())]


def _used(call: Call) -> WireError:
    return WireError(
        code=ErrorCode.INVALID_PARAMS,
        message=f"callId {call.call_id!r} was already used in this session.",
        details={"path": "payload.options.callId"},
    )


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
