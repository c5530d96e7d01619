"""What the session asks its shell to do, and the records the shell reports back.

Each action is one piece of I/O. Those that learn something name the Session
method the shell reports the fact to (`opened`, `call_started`, `cancel_settled`,
`result_claimed`, ...). The shell performs them in order, and performs the actions
a fact returns before going on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capabilities.protocol import CancelPendingRequest, CancelRequest, Initialize, RequestId


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What this connection's principal may do in one session."""

    max_queued_calls: int | None = None
    queue_full_retry_after_ms: int | None = None
    max_timeout_ms: Callable[[str], int] | None = None
    resumable: bool = False


@dataclass(frozen=True, kw_only=True)
class CallRecord:
    """A call as stored: what a resume, a lookup or a note tells the session."""

    call_id: str
    request_id: str
    job_id: str
    progress_token: str | int | None
    status: str
    active: bool
    delivered: bool
    seconds_left: float
    """Until its deadline (meaningful while active)."""
    age_seconds: float = 0.0
    """Since its job was written: a call's duration runs from there, on every door."""
    params_hash: str = ""
    """Its capability and params' digest (protocol/call_digest.py)."""


# -- socket ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Send:
    """Send this encoded envelope; `claims` is the job whose claimed result it carries.

    If the socket turns out gone, report `send_dropped(claims)`: the claim is given back.
    """

    text: str
    claims: str | None = None


@dataclass(frozen=True, kw_only=True)
class Close:
    """Close the socket with this code."""

    code: int


# -- the session's row and group -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OpenSession:
    """Record the session (within the principal's budget), join its group, hold it.

    Report `opened()` or `open_refused(error)`.
    """

    session_id: str
    message: Initialize
    resume_token: str


@dataclass(frozen=True, kw_only=True)
class ResumeSession:
    """Join the session's group, then take it over; report `resumed` or `resume_refused`."""

    session_id: str
    token: str
    awaiting: tuple[str, ...] = ()
    """CallIds the agent still waits on: held ones already answered are answered again."""


@dataclass(frozen=True, kw_only=True)
class AnnounceTakeover:
    """Tell the session's previous connection (any Daphne) to let go."""

    session_id: str
    generation: int


@dataclass(frozen=True, kw_only=True)
class Detach:
    """The socket dropped: let the session go for a resume within the grace period."""

    session_id: str
    generation: int


@dataclass(frozen=True, kw_only=True)
class LetGo:
    """Stop holding the session here (another connection took it over)."""


@dataclass(frozen=True, kw_only=True)
class EndSession:
    """Record that the session ended, and why."""

    session_id: str
    reason: str


# -- calls -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StartCall:
    """Start the call through the call service (off the session's turn, as a task);
    report `call_started`, `call_adopted` or `call_refused`."""

    request_id: RequestId
    stored_request_id: str
    """The request id as the job row keeps it (the dialect's `store_id`)."""
    call_id: str
    capability: str
    params: dict[str, Any]
    params_hash: str
    """The call's idempotency key: a row with its callId and this digest is this call."""
    timeout_ms: int | None
    progress_token: str | int | None
    notify_started: bool
    resent: bool = False
    """Marked re-sent by the agent: it awaits this call, whose result may have gone to a
    socket that died unread (then found answered, it is claimed and sent again)."""


@dataclass(frozen=True, kw_only=True)
class CancelStart:
    """Cancel a call before its row is sealed; report `start_ticket(action, won)` at once."""

    call_id: str
    reason: str
    message: CancelRequest | CancelPendingRequest


@dataclass(frozen=True, kw_only=True)
class SettleCancels:
    """Settle these calls' jobs as cancelled (first step of every cancel).

    Report `cancels_settled(action, won)`, with the settled response of each loser
    when `read_losers` (an agent's cancel tells what the call ended as).
    """

    call_ids: tuple[str, ...]
    job_ids: tuple[str, ...]
    source: str
    reason: str
    delivered: bool
    request_id: RequestId | None = None
    """The confirmed cancel's request, answered with a cancel result."""
    read_losers: bool = False


@dataclass(frozen=True, kw_only=True)
class StopWork:
    """Second step of a won cancel: raise the job's abort flag, then revoke its task."""

    job_id: str


@dataclass(frozen=True, kw_only=True)
class ClaimResult:
    """Claim the sending of a settled call's result; report `result_claimed`."""

    call_id: str
    job_id: str
    response: dict[str, Any] | None


@dataclass(frozen=True, kw_only=True)
class GiveBack:
    """A claimed result could not be sent: release the claim for whoever holds the session."""

    job_id: str


@dataclass(frozen=True, kw_only=True)
class LookUp:
    """Find a call of this session not held here (by call id or job id); report `found`."""

    call_id: str | None = None
    job_id: str | None = None
    then: Then


@dataclass(frozen=True, kw_only=True)
class FindUnanswered:
    """Read every unanswered call of the session; report `unanswered`."""

    then: EndAll


@dataclass(frozen=True, kw_only=True)
class StartTimer:
    """Report `timed_out(call_id)` in `seconds`, unless stopped first."""

    call_id: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class StopTimer:
    """Forget the call's timer."""

    call_id: str


@dataclass(frozen=True, kw_only=True)
class StopTimers:
    """Forget every timer."""


# -- what to do once a lookup returns ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CancelFound:
    """An agent's cancel of a call this connection did not hold."""

    request_id: RequestId
    reason: str


@dataclass(frozen=True, kw_only=True)
class DeliverFound:
    """A settled call this connection did not hold: adopt and deliver it."""

    response: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class EndAll:
    """End every unanswered call (shutdown, revoked key), answering each."""

    source: str
    reason: str


Then = CancelFound | DeliverFound

Action = (
    Send
    | Close
    | OpenSession
    | ResumeSession
    | AnnounceTakeover
    | Detach
    | LetGo
    | EndSession
    | StartCall
    | CancelStart
    | SettleCancels
    | StopWork
    | ClaimResult
    | GiveBack
    | LookUp
    | FindUnanswered
    | StartTimer
    | StopTimer
    | StopTimers
)
