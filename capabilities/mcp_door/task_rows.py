"""MCP tasks read from job rows: which jobs are tasks, and what each one looks like.

A task's callId marks it as one and carries the ttl it was granted, which has no
column of its own: `mcp-task:<ttl ms>:<uuid>`. A plain `tools/call` has a bare
uuid, so it is never a task. A 2025-11-25 task belongs to its MCP session; a
2026-07-28 one (no session) to the agent key that made it. Synchronous: callers
hop with `database_sync_to_async`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.db.models import Q, QuerySet

from capabilities.conf import abp_settings
from capabilities.jobs import lifecycle, results
from capabilities.mcp_door import tools
from capabilities.models import Job, JobStatus

CALL_ID_PREFIX = "mcp-task:"
# Suggested to clients between two tasks/get; most capabilities take seconds.
POLL_INTERVAL_MS = 1000
PAGE_SIZE = 100

STATUSES: dict[str, types.TaskStatus] = {
    JobStatus.QUEUED: "working",
    JobStatus.RUNNING: "working",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


def new_call_id(ttl_ms: int) -> str:
    """The callId of a new task granted `ttl_ms`."""
    return f"{CALL_ID_PREFIX}{ttl_ms}:{uuid.uuid4()}"


def task_of(job: Job) -> types.Task:
    """The task a job is, as its row says now."""
    updated = job.settled_at or job.started_at or job.created_at
    return types.Task(
        task_id=str(job.id),
        status=STATUSES[job.status],
        status_message=status_message(job),
        created_at=job.created_at.isoformat(),
        last_updated_at=updated.isoformat(),
        ttl=int(job.call_id.removeprefix(CALL_ID_PREFIX).split(":", 1)[0]),
        poll_interval=POLL_INTERVAL_MS if job.is_active else None,
    )


def retention_ms() -> int:
    """How long a settled task's row is kept (JOB_RETENTION_DAYS): the longest ttl granted."""
    return int(abp_settings().JOB_RETENTION_DAYS * 86_400_000)


def status_message(job: Job) -> str | None:
    """The stage while it runs; `CODE: message` once it failed or was cancelled."""
    if job.status == JobStatus.QUEUED:
        return "Queued."
    if job.status == JobStatus.RUNNING:
        return job.stage or "Running."
    if job.status == JobStatus.SUCCEEDED:
        return None
    return f"{job.error_code}: {job.error_message}"


def find(session_id: str | None, task_id: str) -> Job | None:
    """A task of this session; never another session's, never a plain call."""
    try:
        job_id = uuid.UUID(task_id)
    except ValueError:
        return None
    return _tasks(session_id).filter(pk=job_id).first()


def find_owned(principal_id: str, task_id: str) -> Job | None:
    """A task made with this agent key (`AgentSession.principal`), on either wire."""
    try:
        job_id = uuid.UUID(task_id)
    except ValueError:
        return None
    return Job.objects.filter(
        pk=job_id, call_id__startswith=CALL_ID_PREFIX, session__principal=principal_id
    ).first()


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of a session's tasks, oldest first."""

    jobs: list[Job]
    next_cursor: str | None
    unknown_cursor: bool = False


def page(session_id: str | None, cursor: str | None) -> Page:
    """The tasks after `cursor` (the last task id of the page before)."""
    tasks = _tasks(session_id).order_by("created_at", "id")
    if cursor is not None:
        after = find(session_id, cursor)
        if after is None:
            return Page(jobs=[], next_cursor=None, unknown_cursor=True)
        tasks = tasks.filter(
            Q(created_at__gt=after.created_at) | Q(created_at=after.created_at, id__gt=after.id)
        )
    jobs = list(tasks[: PAGE_SIZE + 1])
    more = len(jobs) > PAGE_SIZE
    jobs = jobs[:PAGE_SIZE]
    return Page(jobs=jobs, next_cursor=str(jobs[-1].id) if more else None)


def final_response(job_id: str, base_url: str) -> dict[str, Any] | None:
    """A settled task's ABPResponse (its delivery recorded the first time); None while active.

    The same every time it is asked for: a file inlined or linked as for a plain call.
    """
    job = Job.objects.get(pk=job_id)
    if job.is_active:
        return None
    lifecycle.claim_delivery(job_id)
    return results.call_response(job, base_url=base_url, inline_max_bytes=tools.INLINE_MAX_BYTES)


def _tasks(session_id: str | None) -> QuerySet[Job]:
    if session_id is None:
        return Job.objects.none()
    return Job.objects.filter(session_id=uuid.UUID(session_id), call_id__startswith=CALL_ID_PREFIX)
