"""The call service's side of a connection's actions: do them, report what they found.

Composed into the consumer (capabilities/transport/consumer.py), which does the
socket and the timers. Each method performs one action through
the call service and returns the session's answer to what it found.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from capabilities.access.principal import Principal
from capabilities.calls import answers, budgets, job_writes, lane_runs, session_records, start
from capabilities.calls.start_order import StartTurn
from capabilities.calls.start_ticket import StartTicket
from capabilities.endings import cancellation, resumption
from capabilities.jobs import lifecycle, outages, results
from capabilities.models import CancelSource, Door, Job, session_group
from capabilities.session import machine
from capabilities.session.actions import (
    Action,
    CallRecord,
    ClaimResult,
    EndSession,
    FindUnanswered,
    LookUp,
    OpenSession,
    ResumeSession,
    SettleCancels,
    StartCall,
)
from capabilities.session.machine import Session
from capabilities.transport.session_groups import SessionGroups

logger = logging.getLogger(__name__)


def record_of(job: Job) -> CallRecord:
    """What the session needs to know of a stored call."""
    return CallRecord(
        call_id=job.call_id,
        request_id=job.request_id,
        job_id=str(job.id),
        progress_token=job.progress_token,
        status=job.status,
        active=job.is_active,
        delivered=job.delivered_at is not None,
        seconds_left=answers.seconds_left(job),
        age_seconds=results.duration_ms(job, settled_at=timezone.now()) / 1000,
        params_hash=job.params_hash,
    )


class SessionIO:
    """One connection's calls to the call service, on behalf of its session."""

    def __init__(
        self,
        session: Session,
        principal: Principal,
        *,
        base_url: str,
        door: Door,
        groups: SessionGroups,
    ) -> None:
        self.session = session
        self.principal = principal
        self.groups = groups
        self.base_url = base_url
        self.door = door

    @property
    def session_id(self) -> str:
        """The session's id (the session is open)."""
        assert self.session.session_id is not None
        return self.session.session_id

    async def open_session(self, action: OpenSession, origin: str) -> list[Action]:
        """Record the session (within the principal's budget), hear its notes, hold it."""
        try:
            await database_sync_to_async(budgets.open_session)(
                self.principal,
                action.session_id,
                action.message,
                origin=origin,
                resume_token=action.resume_token,
                door=self.door,
            )
        except budgets.OverBudget as over:
            return self.session.open_refused(over.error)
        await self.groups.listen(action.session_id)
        self.groups.hold(action.session_id)
        return self.session.opened(action)

    async def resume(self, action: ResumeSession) -> list[Action]:
        """Take the session over, rotating its token; the refusal if it cannot be."""
        try:
            session_group(action.session_id)
        except ValueError:
            return self.session.resume_refused(resumption.invalid().error)
        # Heard before the session's jobs are read: no settle falls in between. And
        # before its token turns: a resume failing after that (Redis restarting) would
        # leave the agent with a token that no longer works.
        await self.groups.listen(action.session_id)
        replacement = resumption.new_token()
        try:
            resumed, again = await database_sync_to_async(self._resume)(action, replacement)
        except resumption.ResumeRefused as refused:
            await self.groups.stop_listening(action.session_id)
            return self.session.resume_refused(refused.error)
        self.groups.hold(action.session_id)
        return self.session.resumed(
            action,
            token=replacement,
            generation=resumed.generation,
            was_held=resumed.was_held,
            calls=[record_of(job) for job in resumed.jobs],
            again=again,
        )

    def _resume(
        self, action: ResumeSession, replacement: str
    ) -> tuple[resumption.Resumed, list[tuple[CallRecord, dict[str, Any]]]]:
        # One transaction: the token turns only if the answers to send are all there.
        with transaction.atomic():
            resumed = resumption.resume(
                action.session_id, action.token, self.principal, replacement, action.awaiting
            )
            again = [
                (record_of(job), results.call_response(job, base_url=self.base_url))
                for job in resumed.again
            ]
        return resumed, again

    async def start_call(
        self,
        action: StartCall,
        ticket: StartTicket,
        deliver: lane_runs.Deliver,
        turn: StartTurn | None = None,
    ) -> Callable[[], list[Action]]:
        """Start the call through the call service (off the consumer's lock): what to
        report to the session, under the lock, once it is done."""
        call = start.CallRequest(
            session_id=self.session_id,
            call_id=action.call_id,
            request_id=action.stored_request_id,
            capability=action.capability,
            params=action.params,
            params_hash=action.params_hash,
            timeout_ms=action.timeout_ms,
            progress_token=action.progress_token,
            notify_started=action.notify_started,
            generation=self.session.generation,
            ticket=ticket,
            deliver=deliver,
            turn=turn,
        )
        try:
            job = await start.start(self.principal, call)
        except start.CallIdHeld as held:
            again = await self._claimed_again(action, held.job) if action.resent else None
            return functools.partial(self.session.call_adopted, action, record_of(held.job), again)
        except start.CallRefused as refused:
            return functools.partial(self.session.call_refused, action, refused.error)
        except Exception:
            logger.exception("Could not start call %s", action.call_id)
            return functools.partial(self.session.call_refused, action, start.NOT_QUEUED)
        return functools.partial(self.session.call_started, record_of(job))

    async def _claimed_again(self, action: StartCall, job: Job) -> dict[str, Any] | None:
        """A re-sent call's result, if an older connection had claimed it: claimed for
        this one now, to send again. None if unanswered, or answered on this one."""
        generation = self.session.generation
        if job.delivered_at is None or (job.delivered_generation or 0) >= generation:
            return None

        def claim() -> dict[str, Any] | None:
            if not lifecycle.claim_again(Job.objects.filter(pk=job.pk), generation):
                return None
            return results.call_response(job, base_url=self.base_url)

        try:
            again: dict[str, Any] | None = await database_sync_to_async(claim)()
            return again
        except outages.DATABASE_AWAY:
            logger.warning("Could not claim call %s's result again", action.call_id)
            return None

    async def settle_here(
        self, job: Job, outcome: lifecycle.Outcome, response: dict[str, Any]
    ) -> list[Action]:
        """Settle a local run and claim its delivery in one statement; its answer if won."""
        won = await job_writes.settle(
            job_writes.LocalSettle(
                job=job,
                outcome=outcome,
                response=response,
                answered_here=True,
                generation=self.session.generation,
            )
        )
        if not won:  # whoever settled it first tells the session
            return []
        claim = ClaimResult(call_id=job.call_id, job_id=str(job.id), response=response)
        return self.session.result_claimed(claim, response)

    async def settle_cancels(self, action: SettleCancels) -> list[Action]:
        """The cancel pipeline's first step; the losers' responses when asked for."""
        won: dict[str, bool] = await database_sync_to_async(cancellation.settle_cancelled)(
            list(action.job_ids),
            CancelSource(action.source),
            action.reason,
            delivered=action.delivered,
            generation=self.session.generation,
        )
        losers: dict[str, dict[str, Any] | None] = {}
        if action.read_losers:
            for job_id in (job_id for job_id, ok in won.items() if not ok):
                losers[job_id] = await database_sync_to_async(session_records.settled_response)(
                    job_id, self.base_url
                )
        return self.session.cancels_settled(action, won, losers)

    async def claim_result(self, action: ClaimResult) -> list[Action]:
        """Claim the sending of a settled call's result."""
        try:
            claimed = await database_sync_to_async(session_records.claim_response)(
                action.job_id, self.base_url, action.response, generation=self.session.generation
            )
        except outages.DATABASE_AWAY:
            # PostgreSQL restarting. Unclaimed, the result is announced again by the
            # reaper's nudge (resumption.nudge_undelivered) and claimed then.
            logger.warning("Could not claim job %s's result yet", action.job_id)
            return []
        if claimed is session_records.NotClaimed.STILL_ACTIVE:
            return self.session.result_claimed(action, machine.STILL_ACTIVE)
        if claimed is session_records.NotClaimed.DELIVERED_ELSEWHERE:
            return self.session.result_claimed(action, machine.DELIVERED_ELSEWHERE)
        assert isinstance(claimed, dict)
        return self.session.result_claimed(action, claimed)

    async def look_up(self, action: LookUp) -> list[Action]:
        """Find a call of this session, by call id or job id."""
        if action.call_id is not None:
            job = await database_sync_to_async(lifecycle.find_call)(self.session_id, action.call_id)
        else:
            assert action.job_id is not None
            job = await database_sync_to_async(session_records.find_job)(
                self.session_id, action.job_id
            )
        return self.session.found(action, record_of(job) if job is not None else None)

    async def find_unanswered(self, action: FindUnanswered) -> list[Action]:
        """Every unanswered call of the session."""
        pending = await database_sync_to_async(session_records.undelivered_jobs)(self.session_id)
        return self.session.unanswered(action.then, [record_of(job) for job in pending])

    async def end_session(self, action: EndSession) -> list[Action]:
        """Record that the session ended."""
        await database_sync_to_async(session_records.close_session)(
            action.session_id, action.reason
        )
        return []

    async def give_back(self, job_id: str) -> None:
        """Release a claimed result nobody received (if this generation still holds it)."""
        await database_sync_to_async(lifecycle.release_delivery)(job_id, self.session.generation)

    async def detach(self, session_id: str, generation: int) -> None:
        """Start the session's grace period."""
        await database_sync_to_async(resumption.detach)(session_id, generation)
