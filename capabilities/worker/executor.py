"""Run one job in a worker process: start it, run its runner, settle it.

Celery-free apart from the soft time limit exception, so it is the same code
whichever pool runs it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from celery.exceptions import SoftTimeLimitExceeded
from django import db
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from capabilities import tracing
from capabilities.access import permissions
from capabilities.conf import abp_settings
from capabilities.jobs import dispatch, finished, inputs, lifecycle, notes, outages, results
from capabilities.models import CancelSource, Job
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import registry, runs
from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import File, JobAborted
from capabilities.work.context_base import ContextBase
from capabilities.work.users import load_user
from capabilities.worker import last_writes, memory_limit
from capabilities.worker.interrupter import INTERRUPTER, Interrupter

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger(__name__)

# What a worker reads of its job (params can be large; nothing else is needed).
WORKER_FIELDS = (
    "session_id",
    "call_id",
    "capability",
    "params",
    "spilled",
    "progress_token",
    "notify_started",
    "created_at",
    "user_id",
)


class WorkerContext(ContextBase):
    """The JobContext runners get in a worker."""

    span: Span | None = None
    """The run's span while traces are on: progress goes on it as events."""

    def __init__(self, job: Job, interrupter: Interrupter) -> None:
        self._job = job
        self._interrupter = interrupter
        self._session_id = str(job.session_id)
        # The interval starts with the work: a call that ends within it leaves no
        # progress in the DB (the admin only ever sees it settled), and a report the
        # interval held back is written by the heartbeat (`take_unsaved_progress`).
        self._last_db_write = time.monotonic()
        self._unsaved: lifecycle.Progress | None = None
        self._unsaved_lock = threading.Lock()
        self.saved_files: list[str] = []

    @property
    def job_id(self) -> str:
        """The job's id."""
        return str(self._job.id)

    @property
    def cancel_signal(self) -> CancelSignal:
        """The job's cancel, set by the abort watcher."""
        return self._interrupter.signal

    def checkpoint(self) -> None:
        """Raise JobAborted if the job was cancelled (an in-process flag: no I/O)."""
        self._interrupter.checkpoint()

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Send progress to the agent now; to the DB at most every interval."""
        if _event_loop_running():
            # An `async def` capability reports from its event loop, where Django
            # refuses database work: the report is made from a thread of its own.
            _off_the_loop(lambda: self.report(progress=progress, total=total, stage=stage))
            return
        with self._interrupter.shielded():
            if self.span is not None:
                totals = {} if total is None else {"total": total}
                self.span.add_event("progress", {"progress": progress, "stage": stage, **totals})
            if self._job.progress_token is not None:
                notes.notify(
                    self._session_id,
                    notes.job_progress(
                        self._job.call_id, progress=progress, total=total, stage=stage
                    ),
                )
            report = lifecycle.Progress(progress=progress, total=total, stage=stage)
            now = time.monotonic()
            if now - self._last_db_write < abp_settings().PROGRESS_DB_INTERVAL_SECONDS:
                with self._unsaved_lock:
                    self._unsaved = report
                return
            self._last_db_write = now
            with self._unsaved_lock:
                self._unsaved = None
            try:
                lifecycle.record_progress(self.job_id, report)
            except outages.DATABASE_AWAY:
                # The database restarting: the work goes on, the heartbeat writes it later.
                logger.warning("Could not record job %s's progress yet", self.job_id)
                db.close_old_connections()
                with self._unsaved_lock:
                    self._unsaved = report

    def take_unsaved_progress(self) -> lifecycle.Progress | None:
        """The last report the interval kept out of the DB, if any (now taken)."""
        with self._unsaved_lock:
            unsaved, self._unsaved = self._unsaved, None
        return unsaved

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> File:
        """Store output in Django's storage; the consumer inlines or links it."""
        with self._interrupter.shielded():
            name = default_storage.save(f"results/{self.job_id}/{filename}", ContentFile(data))
        self.saved_files.append(name)
        return File({"$file": name, "mimeType": mime_type, "size": len(data), "filename": filename})

    def discard_files(self) -> None:
        """Delete output of a run whose outcome was dropped."""
        for name in self.saved_files:
            default_storage.delete(name)


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _off_the_loop(work: Callable[[], None]) -> None:
    """Do `work` in a thread of its own and wait; its connections are closed after."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failure.append(exc)
        finally:
            db.connections.close_all()
            notes.close_thread_loop()  # its notes' loop and Redis connections, not kept

    thread = threading.Thread(target=run, name="abp-off-loop", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


_running: WorkerContext | None = None


def take_unsaved_progress(job_id: str) -> lifecycle.Progress | None:
    """The running job's last report not in the DB yet (for the heartbeat to write)."""
    context = _running
    if context is None or context.job_id != job_id:
        return None
    return context.take_unsaved_progress()


def execute(job_id: str, *, worker_name: str) -> None:
    """Run a job if it is still queued; settle it unless a cancel got there first."""
    global _running  # noqa: PLW0603 - the one job this process runs, for its heartbeat
    interrupter = INTERRUPTER
    # Register before the start: a cancel that settles after it is heard by the
    # watcher (or, if the watcher was reconnecting, seen in the flag when it is back).
    interrupter.begin(job_id)
    try:
        _execute(job_id, worker_name, interrupter)
    finally:
        _running = None
        interrupter.end()
        # This process's slot is free: the next waiting job may go (fair shares).
        dispatch.pump_safely()


def _execute(job_id: str, worker_name: str, interrupter: Interrupter) -> None:
    # No look at the abort flag first: every flag goes up after a cancel won its
    # settle (endings/cancellation.py), and a settled job is no longer queued, so the
    # conditional start refuses it. A revoke lost while no worker ran changes nothing.
    traced = tracing.enabled()
    fields = (*WORKER_FIELDS, "trace_parent") if traced else WORKER_FIELDS
    job = lifecycle.start(job_id, worker_name, fields)
    if job is None:
        logger.info("Job %s is no longer queued; skipped", job_id)
        return
    if not traced:  # trace_parent was not loaded: reading it would cost a query
        _execute_job(job, interrupter)
        return
    with tracing.span(
        "abp.run", job.trace_parent, job_id=job_id, capability=job.capability, worker=worker_name
    ) as span:
        _execute_job(job, interrupter, span)


def _execute_job(job: Job, interrupter: Interrupter, span: Span | None = None) -> None:
    """Run a started job and settle it (`span`: its run's, while traces are on)."""
    global _running  # noqa: PLW0603 - see execute
    job_id = str(job.id)
    if job.notify_started:
        notes.notify(str(job.session_id), notes.job_started(job.call_id))
    context = _running = WorkerContext(job, interrupter)
    context.span = span
    try:
        refused = _for_whom(job, context)
        outcome = refused or _run(job, context, interrupter)
    except JobAborted:
        # Raised at a checkpoint or into the thread: the cancel already settled it.
        last_writes.written(lambda: lifecycle.record_stopped(job_id), f"job {job_id} stopped")
        context.discard_files()
        logger.info("Job %s stopped on cancel", job_id)
        return
    except SoftTimeLimitExceeded:
        outcome = lifecycle.Outcome.cancelled(CancelSource.TIMEOUT, "Celery soft time limit")
    finally:
        inputs.discard(job_id, job.spilled)
    response = results.inline_response(job, outcome)
    settled = last_writes.written(
        lambda: finished.settle_and_tell(job, outcome, response), f"job {job_id} settled"
    )
    if not settled:
        context.discard_files()


def _for_whom(job: Job, context: WorkerContext) -> lifecycle.Outcome | None:
    """Load the job's user into `ctx.user`, and check again what the start checked.

    The job may have waited: its user may have been deactivated, lost a permission the
    capability requires, or the row its params name changed hands (the `authorize`
    check, which gets the params as stored). None when it may run.
    """
    if job.user_id is not None:
        context.user = load_user(job.user_id)
        if context.user is None:
            error = WireError(
                code=ErrorCode.PERMISSION_DENIED,
                message="The user this call runs for is no longer active.",
                details={"capability": job.capability},
            )
            return lifecycle.Outcome.failed(error)
    spec = registry.get(job.capability)
    refused = None if spec is None else permissions.call_refusal(spec, context.user, job.params)
    return lifecycle.Outcome.failed(refused) if refused is not None else None


def _run(job: Job, context: WorkerContext, interrupter: Interrupter) -> lifecycle.Outcome:
    ran = runs.run(
        job.capability,
        inputs.restore(str(job.id), job.params, job.spilled),
        context,
        within=interrupter.run,
        passing=(SoftTimeLimitExceeded,),
        out_of_memory=memory_limit.error(),
    )
    if ran.out_of_memory:
        # The child reached its memory ceiling: it is replaced after this task.
        memory_limit.mark_exhausted()
        logger.warning("Job %s ran out of memory (limit %s MiB)", job.id, memory_limit.limit_mb())
    elif ran.crashed:
        logger.error("Job %s crashed\n%s", job.id, ran.traceback.rstrip())
    # A cancel that landed after the runner returned is honoured by settle(), which
    # it lost to; the flag only matters for work still to do.
    return lifecycle.Outcome.of_run(ran)
