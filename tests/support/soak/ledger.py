"""Every call made on every door, with its timeline, on the run's clock (seconds); and
the moments of the load that a fault aims at, as the doors reach them."""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """One answer a client received for a call: when, what it says, and the raw detail."""

    at: float
    outcome: str  # succeeded, cancelled, timeout, or error:<CODE>
    detail: dict[str, Any]
    data_ok: bool = True  # the result names this call (not another session's)


@dataclass
class Op:
    """One call: its door, its tag (in its params, and its callId where the door has one)."""

    door: str
    tag: str
    capability: str
    cancel_plan: str | None
    timeout_ms: int | None
    sent_at: float
    session: str = ""
    answers: list[Answer] = field(default_factory=list)
    told: str | None = None  # why the client cannot get an answer (a refused resume...)
    cancelled_at: float | None = None
    timeline: list[tuple[float, str]] = field(default_factory=list)
    late_progress: list[float] = field(default_factory=list)  # progress after its answer
    given_up: bool = False  # the door stopped waiting for it at the end of the run

    @property
    def heavy(self) -> bool:
        """A long call on the heavy workers (test.sleep)."""
        return self.capability == "test.sleep"

    def give_up(self, at: float) -> None:
        """The run ended without its answer (whatever the client is told after that)."""
        if not self.answers and self.told is None:
            self.given_up = True
            self.timeline.append((at, "no answer by the end of the run"))


class Moment(enum.StrEnum):
    """A moment of the load that a fault can wait for (faults.py), as a door reports it."""

    RESUME_SENT = "a resume sent after a socket the server lost"
    """A session's resume went out on a new socket; its old one was not the agent's own drop."""
    CANCEL_DUE = "a call sent, its cancel due"
    """A call went out, and its cancel is to follow `cancel_in` seconds later."""


@dataclass(frozen=True, kw_only=True)
class Reached:
    """A moment reached: when (run clock), by which session or call."""

    moment: Moment
    at: float
    what: str
    session: str = ""
    op: Op | None = None
    cancel_in: float | None = None


class Ledger:
    """The run's calls and its clock."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ops: list[Op] = []
        self.counts: Counter[str] = Counter()  # per door: calls, cancels, answers, drops
        self._serial = itertools.count(1)
        self.sessions: dict[str, list[str]] = {}  # session id -> notes
        self._watches: list[tuple[Moment, Callable[[Reached], bool], asyncio.Future[Reached]]] = []

    def watch(
        self, moment: Moment, accept: Callable[[Reached], bool] = lambda _: True
    ) -> asyncio.Future[Reached]:
        """The next time a door reaches `moment` (one `accept` takes), from now on."""
        found: asyncio.Future[Reached] = asyncio.get_running_loop().create_future()
        self._watches.append((moment, accept, found))
        return found

    def reached(self, moment: Moment, what: str, **details: Any) -> None:
        """A door reached `moment` (on the event loop, as it happens): tell who watches it."""
        if not self._watches:
            return
        reached = Reached(moment=moment, at=self.now(), what=what, **details)
        for watch in list(self._watches):
            kind, accept, found = watch
            if found.done():  # given up on by its fault
                self._watches.remove(watch)
            elif kind is moment and accept(reached):
                found.set_result(reached)
                self._watches.remove(watch)

    def now(self) -> float:
        """Seconds since the run started."""
        return round(time.monotonic() - self.started, 3)

    def new(
        self, door: str, capability: str, cancel_plan: str | None, timeout_ms: int | None
    ) -> Op:
        """A new call of `door`, sent now."""
        tag = f"{door}-{next(self._serial)}"
        op = Op(door, tag, capability, cancel_plan, timeout_ms, self.now())
        self.ops.append(op)
        self.count(door, "calls")
        self.note(op, f"call {capability} sent")
        return op

    def note(self, op: Op, text: str) -> None:
        """Add a line to a call's timeline."""
        op.timeline.append((self.now(), text))

    def note_session(self, session: str, text: str) -> None:
        """Keep a line about a session (a refused resume's attempts) for the report."""
        self.sessions.setdefault(session, []).append(text)

    def count(self, door: str, what: str, n: int = 1) -> None:
        """Count something a door did."""
        self.counts[f"{door}/{what}"] += n

    def answer(self, op: Op, outcome: str, detail: dict[str, Any], *, data_ok: bool = True) -> None:
        """Record an answer to a call (one after the run gave up on it goes to its timeline)."""
        if op.given_up:
            self.note(op, f"answer {outcome}, after the run gave up on it")
            return
        op.answers.append(Answer(self.now(), outcome, detail, data_ok))
        self.count(op.door, "answers")
        # Which frame brought it, on which socket: what tells two answers apart.
        shown = [
            f"{key}={detail[key]}" for key in ANSWER_SOURCE if detail.get(key) not in (None, "")
        ]
        self.note(op, f"answer {outcome}" + (f" ({', '.join(shown)})" if shown else ""))

    def calls_so_far(self) -> int:
        """Calls sent so far, on every door."""
        return len(self.ops)


ANSWER_SOURCE = ("socket", "id", "where")


def outcome_of_error(error: dict[str, Any] | None, cancelled: bool = False) -> str:
    """An ABP error (or cancel) as an outcome."""
    code = (error or {}).get("code", "INTERNAL_ERROR")
    if code == "TIMEOUT":
        return "timeout"
    if cancelled or code == "CANCELLED":
        return "cancelled"
    return f"error:{code}"


def names_call(tag: str, data: Any) -> bool:
    """Whether a result's data is the one of the call tagged `tag` (see plan.params_for)."""
    if not isinstance(data, dict):
        return False
    if "html" in data:
        return f"Call {tag}</h1>" in str(data["html"])
    return data.get("echo") == tag
