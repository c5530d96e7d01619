"""Create, start, settle and deliver jobs: the one place outcomes change.

A job's outcome is written by one conditional update
(`UPDATE ... WHERE id = ? AND status IN (queued, running)`); the row count says who
won. Worker success and failure, agent cancels, timeouts, shutdowns, disconnects,
the reaper and the admin all settle through `settle`. A loser does nothing visible.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.jobs import dispatch, events, inputs, notes, queue, row_inserts, row_updates
from capabilities.jobs.slot_counts import SlotCounts
from capabilities.models import ACTIVE_STATUSES, SETTLED_STATUSES, CancelSource, Job, JobStatus
from capabilities.protocol import WireError, responses
from capabilities.protocol.call_digest import call_digest
from capabilities.work.runs import Ran

logger = logging.getLogger(__name__)


class CallIdInUse(Exception):
    """The session already has a job with this callId.

    `existing`: that job, if it is the same call (the same capability and params);
    None if its call differs, or it could not be read.
    """

    def __init__(self, call_id: str, existing: Job | None = None) -> None:
        super().__init__(call_id)
        self.call_id = call_id
        self.existing = existing


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a job ended: what `settle` writes."""

    status: JobStatus
    result: dict[str, Any] | None = None
    error: WireError | None = None
    traceback: str = ""
    cancel_source: CancelSource | None = None
    cancel_reason: str = ""

    @classmethod
    def succeeded(cls, data: dict[str, Any]) -> Outcome:
        """A result."""
        return cls(status=JobStatus.SUCCEEDED, result=data)

    @classmethod
    def failed(cls, error: WireError, *, traceback: str = "") -> Outcome:
        """An error; the traceback stays in the DB, never goes on the wire."""
        return cls(status=JobStatus.FAILED, error=error, traceback=traceback)

    @classmethod
    def of_run(cls, ran: Ran) -> Outcome:
        """What a runner's run came to (work/runs.py): its result, or its error."""
        if ran.error is not None:
            return cls.failed(ran.error, traceback=ran.traceback)
        assert ran.data is not None
        return cls.succeeded(ran.data)

    @classmethod
    def cancelled(cls, source: CancelSource, reason: str = "") -> Outcome:
        """A cancel; a timeout carries TIMEOUT, every other source CANCELLED."""
        return cls(
            status=JobStatus.CANCELLED,
            error=responses.cancelled_error(source),
            cancel_source=source,
            cancel_reason=reason[:500],
        )


def create_job(
    *,
    session_id: str,
    call_id: str,
    request_id: str,
    capability: str,
    params: dict[str, Any],
    timeout_ms: int | None,
    progress_token: str | int | None,
    notify_started: bool = False,
    principal: str = "",
    user_id: int | None = None,
    client: str = "",
    max_running: int | None = None,
    counts: SlotCounts | None = None,
    settled: Outcome | None = None,
    run_by: str | None = None,
    trace_parent: str = "",
    generation: int = 0,
    params_hash: str = "",
) -> Job:
    """Record a call; once the row is committed, send it to Celery if a slot is free.

    `user_id`: the user the call runs for (ctx.user), if any; `client`: the key or
    OAuth client that made the call for them.
    `max_running`: the principal's share of the workers (MAX_CONCURRENT_CALLS if None).
    `counts`: what the queue and the principal hold, if the caller already read it.
    `settled`: the call was cancelled before this: the row is written with that
    outcome, delivered (its connection, of session generation `generation`, answered
    already), and never sent.
    `run_by`: the caller runs it at once (calls/lane_runs.py): the row is written
    running, by that worker, on the local queue, and never sent.
    `trace_parent`: the call's span, while traces are on (capabilities/tracing.py).
    `params_hash`: the call's digest (protocol/call_digest.py), if the door has it already.
    CallIdInUse if the session has a job with this callId already.
    """
    timeout_ms = min(timeout_ms or abp_settings().DEFAULT_TIMEOUT_MS, abp_settings().MAX_TIMEOUT_MS)
    now = timezone.now()
    job_id = uuid.uuid4()
    queue_name = queue.queue_for(capability)
    share = abp_settings().MAX_CONCURRENT_CALLS if max_running is None else max_running
    if settled is not None:
        run_by, go_now = None, False
    elif run_by is not None:
        queue_name, go_now = queue.LOCAL_QUEUE, True
    else:
        go_now = dispatch.may_go_now(queue_name, principal, share, counts)
    stored_params, spilled = inputs.spill(str(job_id), params)
    job = Job(
        id=job_id,
        session_id=session_id,
        call_id=call_id,
        request_id=request_id,
        capability=capability,
        params=stored_params,
        params_hash=params_hash or call_digest(capability, params),
        spilled=spilled,
        principal=principal,
        user_id=user_id,
        client=client,
        queue=queue_name,
        max_running=share,
        dispatched_at=now if go_now else None,
        progress_token=progress_token,
        notify_started=notify_started,
        created_at=now,
        deadline=now + timedelta(milliseconds=timeout_ms),
        trace_parent=trace_parent,
    )
    if settled is not None:
        for field, value in outcome_values(settled, now).items():
            setattr(job, field, value)
        job.stopped_at = job.delivered_at = now
        job.delivered_generation = generation
    if run_by is not None:
        for field, value in running_values(run_by, now).items():
            setattr(job, field, value)
    try:
        # One autocommitted INSERT (no BEGIN/COMMIT round of its own); on_commit
        # then sends it at once, or when the caller's own transaction commits.
        row_inserts.insert(job)
    except IntegrityError as exc:
        raise CallIdInUse(call_id, existing=_same_call(job)) from exc
    # Robust: the row is committed, so the call is taken. A broker or Redis error past
    # that must not refuse it (its agent would be answered twice); a job handed over
    # and never sent is sent again by the sweep, one never handed over by the pump.
    if events.enabled():
        transaction.on_commit(lambda: _log_created(job), robust=True)
    if settled is None and run_by is None:
        transaction.on_commit(lambda: dispatch.created(job), robust=True)
    return job


def _same_call(job: Job) -> Job | None:
    """The session's job with `job`'s callId, if it is the same call as `job`.

    Not inside a transaction: on PostgreSQL the failed INSERT aborted it, and no
    query runs until it is rolled back (a batch of rows is then written again one
    at a time, calls/job_writes.py, and this finds the job).
    """
    if connection.in_atomic_block:
        return None
    in_use = call_in_use(job.session_id, job.call_id, job.params_hash)
    return in_use.existing if in_use is not None else None


def _log_created(job: Job) -> None:
    """The `created` event, then `dispatched` and `started` if it was made so."""
    happened = ["created"]
    if job.dispatched_at:
        happened.append("dispatched")
    if job.started_at:
        happened.append("started")
    for event in happened:
        events.emit(
            event,
            job.id,
            call_id=job.call_id,
            session_id=job.session_id,
            agent=job.principal,
            capability=job.capability,
            queue=job.queue,
            door=events.door_of(job.session_id),
            **({"worker": job.worker} if event == "started" else {}),
        )


def settle(
    job_id: uuid.UUID | str,
    outcome: Outcome,
    *,
    work_stopped: bool = False,
    delivered: bool = False,
    generation: int = 0,
) -> bool:
    """Write an outcome if the job is still active; True if this call decided it.

    `work_stopped`: the caller is the worker, done with the work, so the same write
    records when it stopped. `delivered`: the caller is the consumer that will send
    the result at once, so the same write claims its delivery for its session
    `generation` (see `claim_delivery`).
    """
    now = timezone.now()
    values = outcome_values(outcome, now)
    if work_stopped:
        values["stopped_at"] = now
    if delivered:
        values["delivered_at"] = now
        values["delivered_generation"] = generation
    updated = row_updates.update_if(
        job_id,
        ACTIVE_STATUSES,
        values,
        # Work that never started stopped when it was settled.
        stop_if=None if work_stopped else (JobStatus.QUEUED, now),
    )
    if not updated:
        logger.debug("Outcome %s for job %s dropped: already settled", outcome.status, job_id)
    return updated == 1


def outcome_values(outcome: Outcome, now: datetime) -> dict[str, Any]:
    """The row's fields that record an outcome settled at `now`."""
    error = outcome.error
    return {
        "status": outcome.status,
        "settled_at": now,
        "result": outcome.result,
        "error_code": error.code if error else "",
        "error_message": error.message if error else "",
        "error_retryable": bool(error and error.to_json()["retryable"]),
        "error_details": error.details if error else None,
        "error_traceback": outcome.traceback,
        "cancel_source": outcome.cancel_source or "",
        "cancel_reason": outcome.cancel_reason,
    }


def running_values(worker: str, now: datetime) -> dict[str, Any]:
    """The row's fields that record its start by `worker` at `now`."""
    return {
        "status": JobStatus.RUNNING,
        "started_at": now,
        "heartbeat_at": now,
        "worker": worker[:200],
    }


def mark_running(job_id: str, worker: str) -> bool:
    """Queued -> running; False if the job was settled or is already running elsewhere."""
    return row_updates.update_if(
        job_id, (JobStatus.QUEUED,), running_values(worker, timezone.now())
    )


def start(job_id: str, worker: str, fields: tuple[str, ...]) -> Job | None:
    """`mark_running`, and the job with `fields` loaded, read by the same statement.

    None if the job was settled (a cancel settles before it raises the abort flag,
    so a cancelled job is refused here) or is already running elsewhere.
    """
    return row_updates.update_returning(
        job_id, (JobStatus.QUEUED,), running_values(worker, timezone.now()), fields
    )


@dataclass(frozen=True, kw_only=True)
class Progress:
    """A running job's progress, as the admin shows it."""

    progress: float
    total: float | None
    stage: str


# The statuses whose work a heartbeat keeps alive (until its `stopped_at` is written).
_BEATING = (JobStatus.RUNNING, JobStatus.CANCELLED)


def heartbeat(job_id: str, progress: Progress | None = None) -> None:
    """The worker running this job is alive; `progress`, a report not written yet."""
    values: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if progress is not None:
        values |= progress_values(progress)
    # Cancelled, its work not stopped yet, it beats on too: its process still runs it,
    # and a beat gone stale says it died with the work (`reaper.stopped_with_process`).
    row_updates.update_if(job_id, _BEATING, values, where_null="stopped_at")


def heartbeat_all(job_ids: list[str]) -> None:
    """The process running these jobs is alive (one statement)."""
    Job.objects.filter(pk__in=job_ids, status__in=_BEATING, stopped_at__isnull=True).update(
        heartbeat_at=timezone.now()
    )


def record_progress(job_id: str, progress: Progress) -> None:
    """Write a running job's progress (for the admin)."""
    row_updates.update_if(job_id, (JobStatus.RUNNING,), progress_values(progress))


def progress_values(progress: Progress) -> dict[str, Any]:
    """The row's fields that hold a job's progress."""
    return {
        "progress": progress.progress,
        "progress_total": progress.total,
        "stage": progress.stage[:100],
    }


def record_stopped(
    job_id: uuid.UUID | str, *, hard_killed: bool = False, at: datetime | None = None
) -> None:
    """Record when the work really stopped (`at`, default now; first report wins)."""
    fields: dict[str, Any] = {"stopped_at": at or timezone.now()}
    if hard_killed:
        fields["hard_killed"] = True
    row_updates.update_if(job_id, (), fields, where_null="stopped_at")


def claim_delivery(job_id: uuid.UUID | str, generation: int = 0) -> bool:
    """Claim the sending of a settled job's result for a connection of session
    `generation` (its fencing token); True for exactly one claimant.

    The claim is written only where none is held: of two connections holding the
    call a moment (a takeover whose old socket still reads), one sends. It records
    its generation, so only its own connection gives it back (`release_delivery`),
    and a resume that sends a result again takes its claim over in the transaction
    that turns the token. Claimed before sending: a crash in between would lose it,
    so a consumer that finds its socket gone gives its claim back. Doors without
    generations (MCP) claim as 0.
    """
    return row_updates.update_if(
        job_id,
        SETTLED_STATUSES,
        {"delivered_at": timezone.now(), "delivered_generation": generation},
        where_null="delivered_at",
    )


def release_delivery(job_id: uuid.UUID | str, generation: int = 0) -> bool:
    """The result could not be sent: give back this generation's claim; True if it held one.

    Only its own claim: one a newer generation took over (a resume sent the result
    again) stays. What was given back goes to whoever holds the session now: a
    connection that resumed it meanwhile may have read its calls before this, and the
    note tells it to take this one too (a later resume finds it anyway).
    """
    released = Job.objects.filter(pk=job_id, delivered_generation=generation).update(
        delivered_at=None, delivered_generation=None
    )
    if not released:
        return False
    job = Job.objects.filter(pk=job_id).only("session_id").first()
    if job is not None:
        notes.notify(str(job.session_id), notes.job_returned(str(job_id)))
    return True


def claim_again(jobs: QuerySet[Job], generation: int) -> int:
    """Take over the results among `jobs` an older generation claimed, for `generation`
    to send again; how many it took over.

    Only for calls their agent says it still awaits (a resume's `awaiting`, a re-sent
    copy): their results went to a socket that died unread.
    """
    return jobs.filter(delivered_at__isnull=False, delivered_generation__lt=generation).update(
        delivered_generation=generation
    )


def find_call(session_id: uuid.UUID | str, call_id: str) -> Job | None:
    """A session's job by callId; never another session's."""
    return Job.objects.filter(session_id=uuid.UUID(str(session_id)), call_id=call_id).first()


def call_in_use(session_id: uuid.UUID | str, call_id: str, params_hash: str) -> CallIdInUse | None:
    """What inserting this call would raise, if the session holds its callId already."""
    found = find_call(session_id, call_id)
    if found is None:
        return None
    return CallIdInUse(call_id, existing=found if found.params_hash == params_hash else None)
