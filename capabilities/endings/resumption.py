"""Resuming a session after its connection dropped: tokens, takeover, expiry.

The state lives in the database (and notes in Redis), never in a Daphne process:
any Daphne can resume any session. A dropped connection detaches its session;
calls keep running; `initialize` with `resume: {sessionId, token}` within the
grace period attaches it to the new connection, which gets the calls still in
flight and every result not yet delivered. The reaper ends sessions nobody held
for the grace period (detached and not resumed, or on a Daphne that died).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from capabilities.access.principal import Principal
from capabilities.conf import abp_settings
from capabilities.endings import cancellation
from capabilities.jobs import lifecycle, notes
from capabilities.models import (
    SETTLED_STATUSES,
    AgentSession,
    CancelSource,
    Job,
)
from capabilities.protocol import ErrorCode, WireError

logger = logging.getLogger(__name__)

BATCH = 200
# A settled result no connection claimed after this long is announced again.
NUDGE_AFTER = timedelta(seconds=2)
NUDGE_WINDOW = timedelta(minutes=10)
BATCH_UPDATE = 500
EXPIRED_REASON = "expired: not resumed in time"


def grace() -> timedelta:
    """How long a dropped session can be resumed."""
    return timedelta(seconds=abp_settings().RESUME_GRACE_SECONDS)


def keep_alive_interval() -> float:
    """How often the consumer holding a session says so (well within the grace)."""
    seconds = grace().total_seconds()
    if seconds <= 0:
        return 10.0  # resuming is off: only a dead Daphne's sessions are looked for
    return max(0.5, min(20.0, seconds / 3))


def unheld_for() -> timedelta:
    """A session not seen this long is nobody's: the grace, and three missed beats.

    With resuming off (grace 0) a consumer ends its session when the socket drops;
    the reaper then only ends the sessions of a Daphne that died.
    """
    return max(grace(), timedelta(seconds=3 * keep_alive_interval()))


def held_lapses_after() -> timedelta:
    """A held session not seen this long is held by no live Daphne: two missed beats.

    It stops counting against its principal's open sessions at once; it stays
    resumable until `unheld_for` has passed, when the reaper ends it.
    """
    return timedelta(seconds=2 * keep_alive_interval())


def new_token() -> str:
    """A resume token: 256 random bits."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the session row keeps of its resume token."""
    return hashlib.sha256(token.encode()).hexdigest()


class ResumeRefused(Exception):
    """The session cannot be resumed; `error` says why (SESSION_INVALID / _EXPIRED)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = WireError(code=code, message=message)


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """A session now held by the resuming connection."""

    generation: int
    was_held: bool
    jobs: list[Job]
    """Its calls not yet delivered, oldest first: in flight, or settled while away."""
    again: list[Job]
    """Calls the agent still awaits whose results were sent on a socket that died unread:
    their claims are this generation's now, for the resume to send them again."""


def invalid() -> ResumeRefused:
    # One answer for unknown sessions, wrong tokens and other agents' sessions:
    # nothing tells a guesser which session ids exist.
    return ResumeRefused(ErrorCode.SESSION_INVALID, "This session cannot be resumed.")


def resume(
    session_id: str,
    token: str,
    principal: Principal,
    replacement: str,
    awaiting: tuple[str, ...] = (),
) -> Resumed:
    """Take the session over for a new connection, rotating its token to `replacement`.

    `awaiting`: the callIds the agent still waits on. Those the session holds and has
    answered already are `again`, their claims taken over by the new generation in
    the token's transaction: the old connection can no longer give them back, nor a
    connection of the new generation claim them again. Those it does not hold never
    reached it.
    """
    now = timezone.now()
    try:
        row = AgentSession.objects.filter(pk=session_id).first()
    except Exception:  # not a UUID
        raise invalid() from None
    if (
        row is None
        or not row.resume_hash
        or not hmac.compare_digest(row.resume_hash, token_hash(token))
        or not _same_holder(row, principal)
    ):
        raise invalid()
    if row.closed_at is not None:
        if row.close_reason == EXPIRED_REASON:
            raise ResumeRefused(ErrorCode.SESSION_EXPIRED, "The session's grace period ended.")
        raise ResumeRefused(ErrorCode.SESSION_INVALID, "The session has ended.")
    if row.seen_at < now - grace():
        raise ResumeRefused(ErrorCode.SESSION_EXPIRED, "The session's grace period ended.")
    with transaction.atomic():
        # Conditional on what was read: of two resumes with the same token, one wins.
        taken = AgentSession.objects.filter(
            pk=row.pk, generation=row.generation, resume_hash=row.resume_hash, closed_at=None
        ).update(
            generation=F("generation") + 1,
            resume_hash=token_hash(replacement),
            detached_at=None,
            seen_at=now,
        )
        if not taken:
            raise invalid()
        generation = row.generation + 1
        # Before `pending` is read: a claim given back meanwhile makes its call pending.
        again = _claim_again(row, awaiting, generation)
        pending = list(Job.objects.filter(session=row, delivered_at=None).order_by("created_at"))
    return Resumed(
        generation=generation, was_held=row.detached_at is None, jobs=pending, again=again
    )


def _same_holder(row: AgentSession, principal: Principal) -> bool:
    """Whether the resuming principal is who opened the session: the same user (or
    none), through the same kind of credential, the same key if it was a key's.

    A resume token is a handle, not a credential: another user resuming is refused even
    with the right token, and so is a signed-out page resuming a signed-in one's.
    """
    key_id = principal.key.pk if principal.key is not None else None
    return (
        row.user_id == principal.user_id
        and row.agent_key_id == key_id
        and row.auth == principal.kind
    )


def _claim_again(session: AgentSession, call_ids: tuple[str, ...], generation: int) -> list[Job]:
    """The session's answered calls among `call_ids` (at most codec.MAX_AWAITING), their
    claims now `generation`'s, oldest first."""
    if not call_ids:
        return []
    asked = Job.objects.filter(session=session, call_id__in=call_ids)
    lifecycle.claim_again(asked, generation)
    # The generation is new: only the claim above wrote it, so these are its rows.
    return list(asked.filter(delivered_generation=generation).order_by("created_at"))


def detach(session_id: str, generation: int) -> None:
    """The holding connection dropped: the grace period starts now."""
    now = timezone.now()
    AgentSession.objects.filter(pk=session_id, generation=generation, closed_at=None).update(
        detached_at=now, seen_at=now
    )


def keep_alive(session_ids: list[str]) -> None:
    """Their holding connections are still there (one statement per 500 sessions)."""
    now = timezone.now()
    for start in range(0, len(session_ids), BATCH_UPDATE):
        chunk = session_ids[start : start + BATCH_UPDATE]
        AgentSession.objects.filter(pk__in=chunk, closed_at=None).update(seen_at=now)


def nudge_undelivered() -> int:
    """Tell the holders of open sessions about results nobody sent for a while.

    A safety net under the hand-over between a session's connections: a result
    settled more than NUDGE_AFTER ago, not claimed, in a session a connection
    holds, is announced to it again (job.returned); its claim still makes the
    sending happen once. Returns how many were announced.
    """
    now = timezone.now()
    stray = Job.objects.filter(
        delivered_at=None,
        status__in=SETTLED_STATUSES,
        settled_at__lt=now - NUDGE_AFTER,
        settled_at__gt=now - NUDGE_AFTER - NUDGE_WINDOW,
        session__closed_at=None,
        session__detached_at=None,
    ).values_list("id", "session_id")[:BATCH]
    nudged = 0
    for job_id, session_id in stray:
        nudged += notes.notify(str(session_id), notes.job_returned(str(job_id)))
    return nudged


def expire_abandoned() -> int:
    """End sessions nobody held for the grace period; cancel their calls. How many."""
    now = timezone.now()
    cutoff = now - unheld_for()
    candidates = AgentSession.objects.filter(closed_at=None, seen_at__lt=cutoff).values_list(
        "id", flat=True
    )[:BATCH]
    ended = 0
    for session_id in candidates:
        # Conditional: a resume that lands first keeps the session.
        if not AgentSession.objects.filter(
            pk=session_id, closed_at=None, seen_at__lt=cutoff
        ).update(closed_at=now, close_reason=EXPIRED_REASON):
            continue
        ended += 1
        cancellation.cancel_session_calls(
            session_id, source=CancelSource.DISCONNECT, reason="session not resumed"
        )
        logger.info("Session %s was not resumed in time; its calls were cancelled", session_id)
    return ended
