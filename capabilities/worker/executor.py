"""Run one job in a worker process: start it, run its runner, settle it.

Celery-free apart from the soft time limit exception, so it is the same code
whichever pool runs it.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from capabilities.jobs import abort_flags, dispatch, inputs, lifecycle, notes, results
from capabilities.models import CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import registry
from capabilities.work.context import CapabilityError, JobAborted
from capabilities.worker import memory_limit
from capabilities.worker.interrupter import INTERRUPTER, Interrupter

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
)


class WorkerContext:
    """The JobContext runners get in a worker."""

    def __init__(self, job: Job, interrupter: Interrupter) -> None:
        self._job = job
        self._interrupter = interrupter
        self._session_id = str(job.session_id)
        self._last_db_write = 0.0
        self.saved_files: list[str] = []

    @property
    def job_id(self) -> str:
        """The job's id."""
        return str(self._job.id)

    def checkpoint(self) -> None:
        """Raise JobAborted if the job was cancelled (an in-process flag: no I/O)."""
        self._interrupter.checkpoint()

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Send progress to the agent now; to the DB at most every interval."""
        with self._interrupter.shielded():
            if self._job.progress_token is not None:
                notes.notify(
                    self._session_id,
                    notes.job_progress(
                        self._job.call_id, progress=progress, total=total, stage=stage
                    ),
                )
            now = time.monotonic()
            if now - self._last_db_write >= settings.ABP["PROGRESS_DB_INTERVAL_SECONDS"]:
                self._last_db_write = now
                Job.objects.filter(pk=self._job.id, status=JobStatus.RUNNING).update(
                    progress=progress, progress_total=total, stage=stage[:100]
                )

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> dict[str, Any]:
        """Store output in Django's storage; the consumer inlines or links it."""
        with self._interrupter.shielded():
            name = default_storage.save(f"results/{self.job_id}/{filename}", ContentFile(data))
        self.saved_files.append(name)
        return {"$file": name, "mimeType": mime_type, "size": len(data), "filename": filename}

    def discard_files(self) -> None:
        """Delete output of a run whose outcome was dropped."""
        for name in self.saved_files:
            default_storage.delete(name)


def execute(job_id: str, *, worker_name: str) -> None:
    """Run a job if it is still queued; settle it unless a cancel got there first."""
    interrupter = INTERRUPTER
    # Register before looking at the flag: a cancel after this point is heard by
    # the watcher, one before it is seen in the flag.
    interrupter.begin(job_id)
    try:
        _execute(job_id, worker_name, interrupter)
    finally:
        interrupter.end()
        # This process's slot is free: the next waiting job may go (fair shares).
        dispatch.pump_safely()


def _execute(job_id: str, worker_name: str, interrupter: Interrupter) -> None:
    if abort_flags.is_raised(job_id):
        logger.info("Job %s was cancelled before it started; skipped", job_id)
        return
    if not lifecycle.mark_running(job_id, worker_name):
        logger.info("Job %s is no longer queued; skipped", job_id)
        return
    job = Job.objects.only(*WORKER_FIELDS).get(pk=job_id)
    session_id = str(job.session_id)
    if job.notify_started:
        notes.notify(session_id, notes.job_started(job.call_id))
    context = WorkerContext(job, interrupter)
    try:
        outcome = _run(job, context, interrupter)
    except JobAborted:
        # Raised at a checkpoint or into the thread: the cancel already settled it.
        lifecycle.record_stopped(job_id)
        context.discard_files()
        logger.info("Job %s stopped on cancel", job_id)
        return
    except SoftTimeLimitExceeded:
        outcome = lifecycle.Outcome.cancelled(CancelSource.TIMEOUT, "Celery soft time limit")
    finally:
        inputs.discard(job_id, job.spilled)
    if lifecycle.settle(job_id, outcome, work_stopped=True):
        response = results.inline_response(job, outcome)
        notes.notify(session_id, notes.job_settled(job.call_id, response))
    else:
        lifecycle.record_stopped(job_id)
        context.discard_files()


def _run(job: Job, context: WorkerContext, interrupter: Interrupter) -> lifecycle.Outcome:
    spec = registry.get(job.capability)
    if spec is None:  # the registry changed under a queued job
        return lifecycle.Outcome.failed(
            WireError(code=ErrorCode.UNKNOWN_CAPABILITY, message="Capability no longer exists.")
        )
    runner = spec.load_runner()
    params = inputs.restore(str(job.id), job.params, job.spilled)
    try:
        data = interrupter.run(lambda: runner(params, context))
    except CapabilityError as exc:
        return lifecycle.Outcome.failed(
            WireError(
                code=exc.code, message=exc.message, details=exc.details, retryable=exc.retryable
            )
        )
    except (JobAborted, SoftTimeLimitExceeded):
        raise
    except MemoryError as exc:
        # The child reached its memory ceiling. Free what the runner's frames hold
        # before formatting anything; the child is replaced after this task.
        traceback.clear_frames(exc.__traceback__)
        memory_limit.mark_exhausted()
        logger.warning("Job %s ran out of memory (limit %s MiB)", job.id, memory_limit.limit_mb())
        return lifecycle.Outcome.failed(memory_limit.error(), traceback=traceback.format_exc())
    except Exception:
        logger.exception("Job %s crashed", job.id)
        return lifecycle.Outcome.failed(
            WireError(
                code=ErrorCode.OPERATION_FAILED,
                message="The operation failed; the error was recorded.",
            ),
            traceback=traceback.format_exc(),
        )
    # A cancel that landed after the runner returned is honoured by settle(), which
    # it lost to; the flag only matters for work still to do.
    return lifecycle.Outcome.succeeded(data)
