"""One connection's calls, each in one phase, moved by one table; and what waits for them.

A call's phase says which events it takes now. `TABLE` maps every (phase, event)
to the next phase and the step the session takes (capabilities/session/machine.py
turns steps into actions). An event its phase does not take yet is held, and
replayed in order once it does: no shell waits on a call's behalf. Nothing here
does I/O or knows a wire (docs/design.md, "A call's phases").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from capabilities.protocol import CancelPendingRequest, CancelRequest, RequestId

logger = logging.getLogger(__name__)


class Phase(Enum):
    """Where one call is, on this connection. An answered call leaves the table."""

    STARTING = "starting"
    """Its start runs and its row is not written: a cancel may still win the start."""
    SEALED = "sealed"
    """Its row is being written: its events wait for the row."""
    CANCELLED_EARLY = "cancelled-early"
    """A cancel won its start: its row is being written, settled as cancelled."""
    IN_FLIGHT = "in-flight"
    """Its job exists, and this connection answers it."""


class Event(Enum):
    """What can happen to a call."""

    ASKED = "asked"
    """A call frame with this callId came (again)."""
    CANCEL = "cancel"
    """The agent asked to cancel it (`capabilities/cancel`, `$/cancel_request`)."""
    TICKET_WON = "ticket-won"
    """The cancel came before the row's seal: the row is written cancelled."""
    TICKET_LOST = "ticket-lost"
    """The row was sealed first: the cancel waits for the row."""
    WRITTEN = "written"
    """The start wrote the call's row."""
    ADOPTED = "adopted"
    """The start found this very call's row already there (the same callId and call)."""
    REFUSED = "refused"
    """The start refused the call."""
    NOTE = "note"
    """A worker's note about it: started, progress, settled."""
    DEADLINE = "deadline"
    """Its timeout passed."""
    ANSWERED = "answered"
    """Its result was sent (or claimed elsewhere): it is over here."""
    LET_GO = "let-go"
    """The connection let the session go: another connection answers it."""


class Step(Enum):
    """What the session does about an event (after the phase has changed)."""

    HOLD = "hold"
    DROP = "drop"
    TRY_TICKET = "try-ticket"
    """Ask the shell to cancel the start before the row is sealed."""
    CANCEL_WON = "cancel-won"
    """Keep the cancel that won: it is answered once the cancelled row is written."""
    CANCEL_WAITS = "cancel-waits"
    """The cancel that lost the start is held until the row is written."""
    ADOPT = "adopt"
    """The call is in flight here: time it, deliver it if it settled already."""
    ADOPT_AND_CANCEL = "adopt-and-cancel"
    """The cancel won a copy whose call another copy wrote: adopt that one, cancel it."""
    ANSWER_CANCELLED = "answer-cancelled"
    """The row is written cancelled: confirm the cancel and answer the call."""
    REFUSE = "refuse"
    """Answer the refusal (and the cancel that won, if one did)."""
    DUPLICATE = "duplicate"
    """A call frame for a call in flight: the same request again, or a reused callId."""
    SETTLE_CANCEL = "settle-cancel"
    SETTLE_TIMEOUT = "settle-timeout"
    FORWARD = "forward"
    """Pass the worker's note on (or claim the settled result)."""
    FORGET = "forget"


@dataclass(frozen=True)
class Cell:
    """One cell of the table: the phase after the event (None: out of the table), the step."""

    then: Phase | None
    step: Step


S, W, C, F = Phase.STARTING, Phase.SEALED, Phase.CANCELLED_EARLY, Phase.IN_FLIGHT
E = Event


def _hold(phase: Phase) -> Cell:
    return Cell(phase, Step.HOLD)


def _drop(phase: Phase) -> Cell:
    return Cell(phase, Step.DROP)


TABLE: dict[tuple[Phase, Event], Cell] = {
    # Starting: the start runs; only a cancel acts now, by trying the start's ticket.
    (S, E.ASKED): _hold(S),
    (S, E.CANCEL): Cell(S, Step.TRY_TICKET),
    (S, E.TICKET_WON): Cell(C, Step.CANCEL_WON),
    (S, E.TICKET_LOST): Cell(W, Step.CANCEL_WAITS),
    (S, E.WRITTEN): Cell(F, Step.ADOPT),
    (S, E.ADOPTED): Cell(F, Step.ADOPT),
    (S, E.REFUSED): Cell(None, Step.REFUSE),
    (S, E.NOTE): _hold(S),
    (S, E.DEADLINE): _drop(S),
    (S, E.ANSWERED): _drop(S),
    (S, E.LET_GO): Cell(None, Step.FORGET),
    # Sealed: the row is on its way; everything about the call waits for it.
    (W, E.ASKED): _hold(W),
    (W, E.CANCEL): _hold(W),
    (W, E.TICKET_WON): _drop(W),
    (W, E.TICKET_LOST): _drop(W),
    (W, E.WRITTEN): Cell(F, Step.ADOPT),
    (W, E.ADOPTED): Cell(F, Step.ADOPT),
    (W, E.REFUSED): Cell(None, Step.REFUSE),
    (W, E.NOTE): _hold(W),
    (W, E.DEADLINE): _drop(W),
    (W, E.ANSWERED): _drop(W),
    (W, E.LET_GO): Cell(None, Step.FORGET),
    # Cancelled early: answered once its cancelled row is written, never before.
    (C, E.ASKED): _hold(C),
    (C, E.CANCEL): _hold(C),
    (C, E.TICKET_WON): _drop(C),
    (C, E.TICKET_LOST): _drop(C),
    (C, E.WRITTEN): Cell(None, Step.ANSWER_CANCELLED),
    (C, E.ADOPTED): Cell(F, Step.ADOPT_AND_CANCEL),
    (C, E.REFUSED): Cell(None, Step.REFUSE),
    (C, E.NOTE): _hold(C),
    (C, E.DEADLINE): _drop(C),
    (C, E.ANSWERED): _drop(C),
    (C, E.LET_GO): Cell(None, Step.FORGET),
    # In flight: this connection answers it, once.
    (F, E.ASKED): Cell(F, Step.DUPLICATE),
    (F, E.CANCEL): Cell(F, Step.SETTLE_CANCEL),
    (F, E.TICKET_WON): _drop(F),
    (F, E.TICKET_LOST): _drop(F),
    (F, E.WRITTEN): _drop(F),
    (F, E.ADOPTED): _drop(F),
    (F, E.REFUSED): _drop(F),
    (F, E.NOTE): Cell(F, Step.FORWARD),
    (F, E.DEADLINE): Cell(F, Step.SETTLE_TIMEOUT),
    (F, E.ANSWERED): Cell(None, Step.FORGET),
    (F, E.LET_GO): Cell(None, Step.FORGET),
}

STARTS = frozenset({S, W, C})
"""Phases in which the call's start has not reported yet."""

Cancel = CancelRequest | CancelPendingRequest


@dataclass(kw_only=True)
class Call:
    """One call of this connection, not answered yet."""

    call_id: str
    request_id: RequestId
    """The id its answer carries (for an adopted call, its first copy's)."""
    stored_request_id: str
    """The request id as the job row keeps it: what `$/cancel_request` names."""
    phase: Phase
    own: bool = True
    """Asked on this connection (not adopted from another of the session's)."""
    digest: str = ""
    """Its capability and params' digest: a re-sent frame with its callId and this
    digest is this call."""
    resent: bool = False
    """Its frame was marked re-sent (after a resume): it may be a copy of a call the
    session holds already, which it then adopts."""
    job_id: str = ""
    progress_token: str | int | None = None
    started: float = 0.0
    """On the session's clock, when its job was written."""
    won_by: Cancel | None = None
    """The cancel that won its start (phase CANCELLED_EARLY)."""


class Wait(Enum):
    """How a held event waits, besides for its own call's phase."""

    FRAME = "frame"
    """An agent's frame: frames are replayed in the order they came."""
    NOTE = "note"
    """A note about one call: it waits for that call only."""
    BARRIER = "barrier"
    """A frame or note about the whole session: it waits until no call is starting."""


@dataclass(frozen=True, kw_only=True)
class Held:
    """An event its call (or the session) does not take yet."""

    wait: Wait
    blocked: Callable[[], bool]
    """Whether its own condition still holds it (its call's phase, pending starts)."""
    replay: Callable[[], list[Any]]


class CallTable:
    """Every unanswered call of one connection, by callId, and the events held for them."""

    def __init__(self) -> None:
        self._calls: dict[str, Call] = {}
        # This connection's own calls by their request id (as stored): what
        # `$/cancel_request` names, and what may not be reused meanwhile.
        self._by_request: dict[str, str] = {}
        self._held: list[Held] = []

    # -- calls ---------------------------------------------------------------------------

    def add(self, call: Call) -> None:
        """A call this connection now answers (or starts)."""
        self._calls[call.call_id] = call
        if call.own:
            self._by_request[call.stored_request_id] = call.call_id

    def get(self, call_id: str | None) -> Call | None:
        return self._calls.get(call_id) if call_id is not None else None

    def by_request(self, stored_request_id: str) -> Call | None:
        """The call this connection's request made, while unanswered."""
        return self.get(self._by_request.get(stored_request_id))

    def request_in_use(self, stored_request_id: str) -> bool:
        return stored_request_id in self._by_request

    @staticmethod
    def holds(call: Call, event: Event) -> bool:
        """Whether the call's phase holds the event for later."""
        return TABLE[(call.phase, event)].step is Step.HOLD

    def on(self, call: Call, event: Event) -> Step:
        """Move `call` by `event` through the table; the step to take."""
        cell = TABLE[(call.phase, event)]
        if cell.step is Step.DROP:
            logger.debug("Call %s: %s dropped in phase %s", call.call_id, event, call.phase)
        if cell.then is None:
            self._remove(call)
        else:
            call.phase = cell.then
        return cell.step

    def _remove(self, call: Call) -> None:
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]
        if self._by_request.get(call.stored_request_id) == call.call_id:
            del self._by_request[call.stored_request_id]

    def in_phase(self, *phases: Phase) -> list[Call]:
        return [call for call in self._calls.values() if call.phase in phases]

    def starting(self) -> bool:
        """Whether any call's start has not reported yet."""
        return any(call.phase in STARTS for call in self._calls.values())

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[Call]:
        return iter(list(self._calls.values()))

    def clear(self) -> None:
        """Let every call go, and every held event: nobody here answers them now."""
        self._calls.clear()
        self._by_request.clear()
        self._held.clear()

    # -- held events -----------------------------------------------------------------------

    def must_hold(self, wait: Wait, blocked: bool) -> bool:
        """Whether a new event waits: its own condition, or an earlier event it stays behind."""
        return blocked or any(_behind(wait, earlier.wait) for earlier in self._held)

    def hold(self, held: Held, *, first: bool = False) -> None:
        self._held.insert(0, held) if first else self._held.append(held)

    def next_ready(self) -> Held | None:
        """Take the first held event that may go now, if any."""
        for index, held in enumerate(self._held):
            earlier = self._held[:index]
            if held.blocked() or any(_behind(held.wait, e.wait) for e in earlier):
                continue
            del self._held[index]
            return held
        return None

    @property
    def holding(self) -> int:
        return len(self._held)


def _behind(wait: Wait, earlier: Wait) -> bool:
    """Whether an event that waits so stays behind an earlier held one that waits so."""
    if wait is Wait.NOTE:
        return False  # a note waits for its own call only
    return earlier is not Wait.NOTE
