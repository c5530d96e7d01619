"""The per-call table (capabilities/session/calls.py) under a shell whose starts are asynchronous.

First, plain tests of `TABLE`. Then a Hypothesis state machine: a fake shell, pure
Python, around one real Session. As in the consumer, a `StartCall` only begins a
start; the start's row is sealed later (a `CancelStart` that comes first wins it),
and its outcome (written, adopted, refused) is reported later still. Worker notes,
claims, timers, a dropped socket and the disconnect come in any order meanwhile.
After every rule the shell performs the session's actions and drains `replay()`,
as `ABPConsumer.handle` does. The job table settles once and claims once. Each run
speaks ABP or JSON-RPC (the latter also cancels by request id, `$/cancel_request`).

What must hold: at most one reply per request (so one result per call) per
connection; a won cancel ends in a cancelled result (or the start's refusal); no
held event is dropped unanswered (frames get their one reply, notes go out once their
call takes them, nothing stays held once every start has reported); every starting
call ends.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from capabilities.jsonrpc import replies as jsonrpc_replies
from capabilities.protocol import (
    CallOptions,
    CallRequest,
    CancelPendingRequest,
    CancelRequest,
    ErrorCode,
    Features,
    Initialize,
    ListCapabilities,
    Message,
    MessageType,
    RequestId,
    Shutdown,
    WireError,
    replies,
    responses,
)
from capabilities.protocol.call_digest import call_digest
from capabilities.session.actions import (
    Action,
    AnnounceTakeover,
    CallRecord,
    CancelStart,
    ClaimResult,
    Close,
    Detach,
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
)
from capabilities.session.calls import STARTS, TABLE, Event, Phase, Step
from capabilities.session.machine import (
    DELIVERED_ELSEWHERE,
    STILL_ACTIVE,
    Claimed,
    ConnectionState,
    Session,
)
from capabilities.session.wire import Wire

# -- the table itself ------------------------------------------------------------------------

START_OUTCOMES = frozenset({Event.WRITTEN, Event.ADOPTED, Event.REFUSED})


def test_every_phase_takes_every_event() -> None:
    assert set(TABLE) == {(phase, event) for phase in Phase for event in Event}


def test_only_the_start_s_outcome_or_letting_go_leaves_a_start_phase() -> None:
    for (phase, event), cell in TABLE.items():
        if phase in STARTS and cell.then not in STARTS:
            assert event in START_OUTCOMES | {Event.LET_GO}, (phase, event, cell)


def test_the_start_s_outcome_ends_every_start_phase() -> None:
    for phase in STARTS:
        for event in START_OUTCOMES:
            assert TABLE[(phase, event)].then not in STARTS, (phase, event)


def test_held_and_dropped_events_leave_the_phase_as_it_was() -> None:
    for (phase, event), cell in TABLE.items():
        if cell.step in (Step.HOLD, Step.DROP):
            assert cell.then is phase, (phase, event, cell)


def test_only_a_call_whose_start_runs_holds_events() -> None:
    held = {phase for (phase, _), cell in TABLE.items() if cell.step is Step.HOLD}
    assert held <= STARTS


# -- a fake shell whose starts report later ----------------------------------------------------

CAPABILITY = "export.pdf"
APP = {"id": "abp-jobs", "name": "ABP Jobs", "version": "0.1.0", "description": "Jobs."}
CALL_IDS = ["a", "b"]
PARAMS: list[dict[str, Any]] = [{"html": "<p>x</p>"}, {"html": "<p>y</p>"}]
ACTIVE = ("queued", "running")
WIRES: dict[str, Wire] = {"abp": replies, "jsonrpc": jsonrpc_replies}
# The session still acts on its calls (a closed one has ended them, or let them go).
LIVE = (ConnectionState.OPEN, ConnectionState.GONE, ConnectionState.ENDING)
CANCELLED_CODES = (ErrorCode.CANCELLED.value, ErrorCode.TIMEOUT.value)
UNAVAILABLE = WireError(code=ErrorCode.INTERNAL_ERROR, message="The call could not be queued.")
INVALID = WireError(code=ErrorCode.INVALID_PARAMS, message="params.html is required.")
TAKEN = WireError(code=ErrorCode.INVALID_PARAMS, message="callId was already used.")


class Ticket:
    """A start's ticket: a cancel before the seal wins it, after it loses (start_ticket.py)."""

    def __init__(self) -> None:
        self.sealed = False
        self.cancelled = False

    def cancel(self) -> bool:
        if self.sealed:
            return False
        self.cancelled = True
        return True

    def seal(self) -> bool:
        """About to write the row: whether a cancel came first."""
        if not self.cancelled:
            self.sealed = True
        return self.cancelled


@dataclass
class Row:
    """A job's row: one per callId in the session; settled once, its result claimed once."""

    job_id: str
    call_id: str
    request_id: str
    """As stored (the wire's `store_id`)."""
    digest: str
    progress_token: str | int | None
    own: bool = True
    """Written by a start of this connection (not by another of the session's)."""
    status: str = "queued"
    delivered: bool = False
    response: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def record(self) -> CallRecord:
        return CallRecord(
            call_id=self.call_id,
            request_id=self.request_id,
            job_id=self.job_id,
            progress_token=self.progress_token,
            status=self.status,
            active=self.active,
            delivered=self.delivered,
            seconds_left=30.0,
            params_hash=self.digest,
        )


class Outcome(Enum):
    WRITTEN = "written"
    ADOPTED = "adopted"
    REFUSED = "refused"


@dataclass(eq=False)
class Start:
    """A start task: its ticket, and once sealed, what it found."""

    action: StartCall
    ticket: Ticket = field(default_factory=Ticket)
    outcome: Outcome | None = None
    record: CallRecord | None = None
    """The row as written or found: what the start reports."""
    error: WireError | None = None
    won_by: CancelRequest | CancelPendingRequest | None = None
    """The cancel that won its ticket."""


class Kind(Enum):
    """What a request asks."""

    INITIALIZE = "initialize"
    CALL = "call"
    CANCEL = "cancel"
    CANCEL_REQUEST = "cancel-request"
    """JSON-RPC's `$/cancel_request`: a notification, never answered itself."""
    LIST = "list"
    SHUTDOWN = "shutdown"


# Calls and cancels most often (a shutdown is `connection_ends`'s).
AGENT_SENDS = [Kind.CALL, Kind.CANCEL, Kind.CALL, Kind.CANCEL, Kind.CANCEL_REQUEST, Kind.LIST]


@dataclass(frozen=True)
class Frame:
    """A request the agent sent (or another connection of the session did)."""

    kind: Kind
    call_id: str | None = None
    digest: str = ""
    resent: bool = False
    """A call marked re-sent: the same call again is that call, answered once."""
    owed: bool = False
    """Owed exactly one reply: sent while the session was open, before any shutdown."""


@dataclass(frozen=True)
class Reply:
    """A reply the session sent to a request, as read from the wire."""

    error: bool
    cancelled: bool


class CallTableWorld(RuleBasedStateMachine):
    """One connection's calls, with starts that report whenever the test says.

    The agent calls (the same callId again, with the same params or others, marked
    re-sent or not), cancels by callId or (JSON-RPC) by request id, lists, shuts down;
    the session's previous connection writes a call this one answers. Starts are
    sealed and report in any order; workers note and settle, a local run answers at
    once; the reaper nudges; timers fire, also after they were stopped; the socket
    drops and the disconnect follows.
    """

    def __init__(self) -> None:
        super().__init__()
        self.wire: Wire = replies
        self.session = Session(capability_names=list, app=dict(APP))
        self.rows: dict[str, Row] = {}
        self.pending: list[Start] = []
        self.tickets: dict[str, Start] = {}
        self.frames: dict[RequestId, Frame] = {}
        self.replies: dict[RequestId, list[Reply]] = {}
        self.timers: set[str] = set()
        self.stale: set[str] = set()
        self.unstopped: set[str] = set()
        self.socket_open = True
        self.dropped = False
        self.disconnected = False
        self.shut = False
        self.notes_lost = False
        self.notifications = False
        self.held_notes: dict[str, list[str]] = {}
        self.notified: Counter[str] = Counter()
        self.numbers: Iterator[int] = itertools.count(1)

    @initialize(
        wire=st.sampled_from(sorted(WIRES)),
        resumable=st.booleans(),
        limit=st.sampled_from([None, 2]),
        notifications=st.booleans(),
    )
    def open_session(
        self, wire: str, resumable: bool, limit: int | None, notifications: bool
    ) -> None:
        self.wire = WIRES[wire]
        ids = (f"id-{n}" for n in itertools.count(1))
        self.session = Session(
            capability_names=lambda: [CAPABILITY],
            app=dict(APP),
            wire=self.wire,
            new_id=lambda: next(ids),
            new_token=lambda: "token",
            clock=lambda: 100.0,
        )
        assert self.session.accepted(Limits(max_queued_calls=limit, resumable=resumable)) == []
        request_id = self.request_id()
        self.frames[request_id] = Frame(Kind.INITIALIZE)
        self.notifications = notifications
        features = Features(notifications=notifications, progress=True)
        self.handle(lambda: self.session.receive(Initialize(id=request_id, features=features)))
        assert self.session.state is ConnectionState.OPEN

    def request_id(self) -> RequestId:
        """ABP's ids are strings; JSON-RPC's here are numbers, stored as their JSON text."""
        number = next(self.numbers)
        return f"r-{number}" if self.wire is replies else number

    def pick(self, data: st.DataObject, items: list[Any], label: str) -> Any:
        return items[data.draw(st.integers(0, len(items) - 1), label=label)]

    # -- the agent -------------------------------------------------------------------------

    @precondition(lambda self: not self.disconnected)
    @rule(
        data=st.data(),
        kind=st.sampled_from(AGENT_SENDS),
        call_id=st.sampled_from([*CALL_IDS, None]),
        variant=st.sampled_from([0, 0, 1]),
        capability=st.sampled_from([CAPABILITY] * 4 + ["nope"]),
        progress=st.booleans(),
        resent=st.booleans(),
    )
    def agent_sends(
        self,
        *,
        data: st.DataObject,
        kind: Kind,
        call_id: str | None,
        variant: int,
        capability: str,
        progress: bool,
        resent: bool,
    ) -> None:
        """A frame from the agent: a call (its callId perhaps used already, with the same
        params or others; marked re-sent or not), a cancel by callId or by request id,
        a listing."""
        if kind is Kind.CANCEL_REQUEST and self.wire is replies:
            kind = Kind.CANCEL  # ABP has no `$/cancel_request`
        request_id = None if kind is Kind.CANCEL_REQUEST else self.request_id()
        digest = ""
        message: Message
        if kind is Kind.CALL:
            token = f"t-{request_id}" if progress else None
            resent = resent and call_id is not None
            options = CallOptions(call_id=call_id, progress_token=token, resent=resent)
            assert request_id is not None
            message = CallRequest(
                id=request_id, capability=capability, params=PARAMS[variant], options=options
            )
            digest = call_digest(capability, PARAMS[variant])
        elif kind is Kind.CANCEL:
            assert request_id is not None
            call_id = call_id or "ghost"
            message = CancelRequest(id=request_id, call_id=call_id)
        elif kind is Kind.CANCEL_REQUEST:
            calls = [rid for rid, frame in self.frames.items() if frame.kind is Kind.CALL]
            named = self.pick(data, [*calls[-3:], 999], "request")
            message = CancelPendingRequest(request_id=named)
        else:
            assert request_id is not None
            message = ListCapabilities(id=request_id)
        if request_id is not None:
            owed = self.session.state is ConnectionState.OPEN and self.socket_open
            owed = owed and not self.shut
            self.frames[request_id] = Frame(
                kind, call_id, digest, kind is Kind.CALL and resent, owed
            )
        self.handle(lambda: self.session.receive(message))

    @precondition(lambda self: not self.disconnected and len(self.rows) < len(CALL_IDS))
    @rule(data=st.data(), variant=st.sampled_from([0, 0, 1]))
    def another_connection_calls(self, data: st.DataObject, variant: int) -> None:
        """The session's previous connection, superseded, still writes a call the agent
        sent it; this connection answers it (and may be sent the same call again)."""
        call_id = self.pick(data, [c for c in CALL_IDS if c not in self.rows], "callId")
        request_id = f"other-{next(self.numbers)}"
        self.frames[request_id] = Frame(Kind.CALL, call_id)
        digest = call_digest(CAPABILITY, PARAMS[variant])
        stored = self.wire.store_id(request_id)
        self.write(call_id, stored, digest, f"t-{request_id}").own = False

    # -- starts ------------------------------------------------------------------------------

    def write(self, call_id: str, request_id: str, digest: str, token: str | int | None) -> Row:
        row = Row(f"job-{next(self.numbers)}", call_id, request_id, digest, token)
        self.rows[call_id] = row
        return row

    def seal(self, start: Start, *, refuse: bool) -> None:
        """The row's database hop: seal the ticket, then insert or find the row.

        A start refused there (a worker unavailable, the budget) is written all the same,
        settled, if its cancel won first (calls/job_writes.py).
        """
        action = start.action
        cancelled = start.ticket.seal()
        row = self.rows.get(action.call_id)
        if row is not None:
            if row.digest == action.params_hash:
                start.outcome, start.record = Outcome.ADOPTED, row.record()
            else:
                start.outcome, start.error = Outcome.REFUSED, TAKEN
        elif refuse and not cancelled:
            start.outcome, start.error = Outcome.REFUSED, UNAVAILABLE
        else:
            row = self.write(
                action.call_id, action.stored_request_id, action.params_hash, action.progress_token
            )
            if cancelled:  # settled as cancelled and delivered: its answer is on its way
                row.status, row.delivered = "cancelled", True
                row.response = responses.cancelled(action.call_id, "agent", 0)
            start.outcome, start.record = Outcome.WRITTEN, row.record()

    @precondition(lambda self: any(start.outcome is None for start in self.pending))
    @rule(data=st.data(), refuse=st.booleans())
    def start_is_sealed(self, data: st.DataObject, refuse: bool) -> None:
        unsealed = [start for start in self.pending if start.outcome is None]
        self.seal(self.pick(data, unsealed, "start"), refuse=refuse)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data(), early=st.booleans())
    def start_reports(self, data: st.DataObject, early: bool) -> None:
        self.report(self.pick(data, self.pending, "start"), early=early)

    def report(self, start: Start, *, early: bool) -> None:
        """The start task ends: its outcome goes to the session (refused before its
        row if `early` and not sealed yet: its params were invalid)."""
        action = start.action
        if start.outcome is None:
            if early:
                start.outcome, start.error = Outcome.REFUSED, INVALID
            else:
                self.seal(start, refuse=False)
        self.pending.remove(start)
        session = self.session
        record = start.record
        held_notes = self.held_notes.pop(action.call_id, [])
        notified = self.notified[action.call_id]
        if start.outcome is Outcome.WRITTEN:
            assert record is not None
            self.handle(lambda: session.call_started(record))
        elif start.outcome is Outcome.ADOPTED:
            assert record is not None
            self.handle(lambda: session.call_adopted(action, record))
        else:
            assert start.error is not None
            error = start.error
            self.handle(lambda: session.call_refused(action, error))
        if self.tickets.get(action.call_id) is start:
            del self.tickets[action.call_id]
        if start.won_by is not None:
            self.check_won_start(start)
        in_flight = session.in_flight(action.call_id)
        if in_flight is not None and session.state in LIVE:
            # The notes held for it went out as it took them (a note held is not dropped).
            told = [note for note in held_notes if note == "started" and self.notifications]
            told += [note for note in held_notes if note == "progress" and in_flight.progress_token]
            assert self.notified[action.call_id] - notified == len(told), (held_notes, in_flight)

    def check_won_start(self, start: Start) -> None:
        """A cancel that won a start ends in the cancelled call, or in the refusal; a
        confirmed cancel is answered at once (adopted: as the adopted call's cancel)."""
        answers = self.replies.get(start.action.request_id, [])
        won_by = start.won_by
        confirmed = self.replies.get(won_by.id, []) if isinstance(won_by, CancelRequest) else []
        if start.outcome is Outcome.WRITTEN:
            assert answers == [Reply(error=True, cancelled=True)], answers
            assert all(reply.cancelled for reply in confirmed), confirmed
        elif start.outcome is Outcome.REFUSED:
            assert answers == [Reply(error=True, cancelled=False)], answers
            assert not any(reply.cancelled for reply in confirmed), confirmed
        elif not self.frames[start.action.request_id].resent:
            # A reused callId (not marked re-sent) is refused, though a row has the
            # same call; its cancel cancels the call that holds the callId.
            assert answers == [Reply(error=True, cancelled=False)], answers
        if isinstance(won_by, CancelRequest):
            assert len(confirmed) == 1, start

    # -- workers, the reaper, timers ---------------------------------------------------------

    def active_rows(self) -> list[Row]:
        return [row for row in self.rows.values() if row.active]

    def unclaimed_rows(self) -> list[Row]:
        return [row for row in self.rows.values() if not row.active and not row.delivered]

    @precondition(lambda self: bool(self.active_rows()))
    @rule(
        data=st.data(),
        kind=st.sampled_from(["started", "progress", "succeeded", "failed", "cancelled", "local"]),
        carry=st.booleans(),
        lost=st.booleans(),
    )
    def worker_notes(self, data: st.DataObject, kind: str, carry: bool, lost: bool) -> None:
        """A worker's note (started, progress), or a job settling (an operator's cancel
        among them) and its note, unless that is lost; or a local run ending, answered
        at once if this connection answers its call (ABPConsumer.deliver_here)."""
        row: Row = self.pick(data, self.active_rows(), "row")
        call_id = row.call_id
        if kind == "local":
            kind = "succeeded"
            if self.session.answers(call_id):
                # Settled and claimed in one statement, performed under the lock, with
                # no replay after it (deliver_here is not a `handle`).
                response = responses.succeeded(call_id, {"html": "<p>x</p>"}, 12)
                row.status, row.response, row.delivered = kind, response, True
                claim = ClaimResult(call_id=call_id, job_id=row.job_id, response=response)
                self.perform(self.session.result_claimed(claim, response))
                return
        if kind in ("started", "progress"):
            call = self.session.calls.get(call_id)
            if call is not None and call.phase in STARTS:  # held until the start reports
                self.held_notes.setdefault(call_id, []).append(kind)
        if kind == "started":
            row.status = "running"
            self.handle(lambda: self.session.job_started(call_id))
            return
        if kind == "progress":
            self.handle(
                lambda: self.session.job_progress(call_id, progress=1.0, total=2.0, stage="half")
            )
            return
        if kind == "succeeded":
            response = responses.succeeded(call_id, {"html": "<p>x</p>"}, 12)
        elif kind == "failed":
            error = WireError(code=ErrorCode.OPERATION_FAILED, message="Bad input.")
            response = responses.failed(call_id, error, 5)
        else:
            response = responses.cancelled(call_id, "operator", 5)
        row.status, row.response = kind, response
        self.notes_lost |= lost
        if not lost:
            carried = response if carry else None
            self.handle(lambda: self.session.job_settled(call_id, carried))

    @precondition(lambda self: bool(self.unclaimed_rows()))
    @rule(data=st.data(), nudge=st.booleans())
    def settled_call_announced_again(self, data: st.DataObject, nudge: bool) -> None:
        """A late or second note about a settled call, or the reaper's nudge of a result
        nobody claimed (its note lost, or its claim given back)."""
        row: Row = self.pick(data, self.unclaimed_rows(), "row")
        if nudge:
            self.handle(lambda: self.session.job_returned(row.job_id))
        else:
            self.handle(lambda: self.session.job_settled(row.call_id, None))

    @precondition(lambda self: bool(self.timers or self.stale))
    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        """A call's timer, or one stopped after its callback was already waiting."""
        due = [(call_id, False) for call_id in sorted(self.timers)]
        due += [(call_id, True) for call_id in sorted(self.stale)]
        call_id, stale = self.pick(data, due, "timer")
        (self.stale if stale else self.timers).discard(call_id)
        self.handle(lambda: self.session.timed_out(call_id))

    # -- the socket ------------------------------------------------------------------------

    @precondition(lambda self: self.socket_open and len(self.frames) > 8)
    @rule(shutdown=st.booleans())
    def connection_ends(self, shutdown: bool) -> None:
        """The agent shuts the session down, or the socket drops; once the agent has
        sent a few frames (an early end finds little to hold)."""
        if shutdown and not self.shut:
            request_id = self.request_id()
            self.frames[request_id] = Frame(Kind.SHUTDOWN)
            self.shut = True
            self.handle(lambda: self.session.receive(Shutdown(id=request_id)))
        else:
            self.socket_open, self.dropped = False, True

    @precondition(lambda self: not self.socket_open and not self.disconnected)
    @rule()
    def disconnect_arrives(self) -> None:
        """Held by the session until every start has reported, as the consumer's is."""
        self.disconnected = True
        assert self.session.socket_gone() == []
        self.handle(lambda: self.session.disconnected(1006))

    @precondition(
        lambda self: (
            self.disconnected
            and not (self.pending or self.timers or self.stale)
            and not (self.active_rows() or self.unclaimed_rows())
        )
    )
    @rule()
    def nothing_is_left(self) -> None:
        """The connection is over and nothing more can happen to it."""

    # -- the shell ---------------------------------------------------------------------------

    def handle(self, event: Callable[[], list[Action]]) -> None:
        """ABPConsumer.handle: the event's actions, then whatever it held back."""
        self.perform(event())
        while (held := self.session.replay()) is not None:
            self.perform(held)

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            self.perform(self.perform_one(action))

    def perform_one(self, action: Action) -> list[Action]:
        session = self.session
        match action:
            case Send():
                self.read(action)
                return [] if self.socket_open else session.send_dropped(action.claims)
            case Close():
                self.socket_open = False
                return session.socket_gone()
            case StartTimer():
                self.timers.add(action.call_id)
            case StopTimer():
                if action.call_id in self.timers:
                    self.timers.discard(action.call_id)
                    self.stale.add(action.call_id)
            case StopTimers():
                self.stale |= self.timers
                self.timers.clear()
            case StopWork():
                assert action.job_id in self.unstopped, f"{action.job_id} stopped twice"
                self.unstopped.discard(action.job_id)
            case GiveBack():
                row = self.row_of_job(action.job_id)
                assert row.delivered
                row.delivered = False
            case OpenSession():
                return session.opened(action)
            case StartCall():
                start = Start(action)
                self.pending.append(start)
                self.tickets[action.call_id] = start
            case CancelStart():
                ticketed = self.tickets.get(action.call_id)
                won = ticketed is not None and ticketed.ticket.cancel()
                if won:
                    assert ticketed is not None
                    ticketed.won_by = action.message
                return session.start_ticket(action, won)
            case SettleCancels():
                return self.settle_cancels(action)
            case ClaimResult():
                return session.result_claimed(action, self.claim(action))
            case LookUp():
                found = next(
                    (
                        row.record()
                        for row in self.rows.values()
                        if row.call_id == action.call_id or row.job_id == action.job_id
                    ),
                    None,
                )
                return session.found(action, found)
            case FindUnanswered():
                unanswered = [row.record() for row in self.rows.values() if not row.delivered]
                return session.unanswered(action.then, unanswered)
            case ResumeSession() | AnnounceTakeover():
                raise AssertionError(f"no resume here: {action}")
            case Detach() | LetGo() | EndSession():
                pass
        return []

    def row_of_job(self, job_id: str) -> Row:
        return next(row for row in self.rows.values() if row.job_id == job_id)

    def settle_cancels(self, action: SettleCancels) -> list[Action]:
        won: dict[str, bool] = {}
        for call_id, job_id in zip(action.call_ids, action.job_ids, strict=True):
            row = self.row_of_job(job_id)
            assert row.call_id == call_id
            won[job_id] = row.active
            if row.active:  # the first settle wins
                row.status = "cancelled"
                row.response = responses.cancelled(call_id, action.source, 5)
                row.delivered = action.delivered
                self.unstopped.add(job_id)
        losers = {
            job_id: self.row_of_job(job_id).response
            for job_id, ok in won.items()
            if not ok and action.read_losers
        }
        return self.session.cancels_settled(action, won, losers)

    def claim(self, action: ClaimResult) -> Claimed:
        row = self.row_of_job(action.job_id)
        if row.active:
            return STILL_ACTIVE
        if row.delivered:
            return DELIVERED_ELSEWHERE
        row.delivered = True
        response = action.response if action.response is not None else row.response
        assert response is not None
        return response

    # -- what the agent is sent ---------------------------------------------------------------

    def read(self, action: Send) -> None:
        """Note a reply to a request, and check it against the rows."""
        parsed = self.parse(action.text)
        if parsed is None:
            return
        request_id, reply = parsed
        frame = self.frames[request_id]
        if frame.kind in (Kind.INITIALIZE, Kind.SHUTDOWN):
            return
        answers = self.replies.setdefault(request_id, [])
        answers.append(reply)
        assert len(answers) == 1, f"request {request_id!r} ({frame}) answered twice: {answers}"
        if frame.kind is Kind.CANCEL and reply.cancelled:
            # A cancel that says it won: the call's row ended cancelled.
            assert frame.call_id is not None
            row = self.rows.get(frame.call_id)
            assert row is not None, frame
            assert row.status == "cancelled", (frame, row)
        written = self.row_written_by(request_id)
        if frame.kind is Kind.CALL and written is not None:
            # The result of a written call: as it ended (cancelled, if a cancel won).
            assert not written.active, written
            assert reply.cancelled is (written.status == "cancelled"), (written, reply)

    def row_written_by(self, request_id: RequestId) -> Row | None:
        """The row a request wrote, if it did."""
        stored = self.wire.store_id(request_id)
        return next((row for row in self.rows.values() if row.request_id == stored), None)

    def parse(self, text: str) -> tuple[RequestId, Reply] | None:
        """A reply's request id and what it says; None for notifications."""
        message = json.loads(text)
        self.count_notification(message)
        if self.wire is replies:
            if message["type"] not in (
                MessageType.INITIALIZE_RESULT,
                MessageType.CALL_RESULT,
                MessageType.CANCEL_RESULT,
                MessageType.LIST_RESULT,
            ):
                return None
            payload = message["payload"]
            return message["id"], Reply(
                error="error" in payload, cancelled=payload.get("cancelled") is True
            )
        if message.get("method") == "_abp/result":  # a call another connection made
            message = {**message["params"], "id": message["params"]["requestId"]}
        elif "id" not in message:
            return None
        if "error" in message:
            code = message["error"].get("data", {}).get("code")
            return message["id"], Reply(error=True, cancelled=code in CANCELLED_CODES)
        result = message["result"]
        return message["id"], Reply(error=False, cancelled=result.get("cancelled") is True)

    def count_notification(self, message: dict[str, Any]) -> None:
        """Count a started or progress notification against its call."""
        body = message.get("payload") or message.get("params") or {}
        kind = message.get("type") or message.get("method")
        if kind in (MessageType.NOTIFICATION, "_abp/operation/started"):
            event = body.get("event", "notifications/operation/started")
            if event == "notifications/operation/started":
                data = body.get("data", body)
                self.notified[data["operationId"]] += 1
        elif kind == MessageType.PROGRESS:  # ABP names the call by its token alone
            token = body["operationId"]
            self.notified[
                next(r.call_id for r in self.rows.values() if r.progress_token == token)
            ] += 1
        elif kind == "_abp/progress":
            self.notified[body["callId"]] += 1

    # -- what holds ---------------------------------------------------------------------------

    @invariant()
    def every_starting_call_has_its_start_running(self) -> None:
        """Every starting call ends: a call stays in a start phase only while its start runs."""
        starting = {call.call_id for call in self.session.calls if call.phase in STARTS}
        assert starting <= {start.action.call_id for start in self.pending}, starting

    @invariant()
    def nothing_is_held_once_every_start_reported(self) -> None:
        if self.pending:
            return
        if self.session.state in (ConnectionState.CLOSED, ConnectionState.DETACHED):
            return
        assert self.session.calls.holding == 0, self.session.state

    @invariant()
    def a_session_ended_here_leaves_none_of_its_calls_running(self) -> None:
        if self.pending or self.session.state is not ConnectionState.CLOSED:
            return
        for row in self.active_rows():
            assert not row.own, row

    @invariant()
    def calls_in_flight_are_their_rows(self) -> None:
        for call in self.session.calls:
            if call.phase is Phase.IN_FLIGHT:
                row = self.rows.get(call.call_id)
                assert row is not None, call
                assert row.job_id == call.job_id, (call, row)

    @invariant()
    def timers_run_only_for_calls_in_flight(self) -> None:
        for call_id in self.timers:
            assert self.session.in_flight(call_id) is not None, call_id

    @invariant()
    def every_won_settle_stopped_its_work(self) -> None:
        assert self.unstopped == set()

    def teardown(self) -> None:
        """Every start reports, every job settles: each request owed a reply has one."""
        while self.pending:
            self.report(self.pending[0], early=False)
        self.nothing_is_held_once_every_start_reported()
        for row in self.active_rows():
            row.status = "succeeded"
            row.response = responses.succeeded(row.call_id, {"html": "<p>x</p>"}, 12)
            self.handle(functools.partial(self.session.job_settled, row.call_id, None))
        if not self.notes_lost:
            self.check_every_request_answered()
        for row in self.unclaimed_rows():  # announced again by the reaper
            self.handle(functools.partial(self.session.job_returned, row.job_id))
        self.check_every_request_answered()

    def check_every_request_answered(self) -> None:
        """Exactly one reply to each call, cancel and list sent while the session was
        open (unless the socket dropped: results are then left for a resume)."""
        if self.dropped:
            return
        order = list(self.frames)  # as sent
        for request_id, frame in self.frames.items():
            if not frame.owed or frame.kind is Kind.SHUTDOWN:
                continue
            answers = self.replies.get(request_id, [])
            if frame.kind is Kind.CALL and not answers:
                # Only the same call again (its callId and params), marked re-sent, goes
                # unanswered: it is the call an earlier request wrote (or another
                # connection did), answered as that one.
                assert frame.resent, (request_id, frame)
                row = self.rows.get(frame.call_id or "")
                assert row is not None, (request_id, frame)
                assert row.digest == frame.digest, (request_id, frame, row)
                first = self.wire.load_id(row.request_id)
                assert not row.own or order.index(first) < order.index(request_id), (frame, row)
                continue
            assert len(answers) == 1, (request_id, frame, answers)


CallTableWorld.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None, database=None
)
TestCallTableWorld = CallTableWorld.TestCase
