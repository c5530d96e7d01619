"""MCP tasks read from job rows: which jobs are tasks, and what each one looks like.

A task's callId marks it as one and carries the ttl it was granted, which has no
column of its own: `mcp-task:<ttl ms>:<uuid>`. A plain `tools/call` has a bare
uuid, so it is never a task.

A task id is a handle, never a credential (MCP binds tasks to the authorization
context): on either wire a task is found, listed, read and cancelled only by its
owner. That is the user it runs for, whichever of their keys, tokens or sessions
made it; for a call that runs for nobody (a service key; development's anonymous
callers), the principal that made it (`key:<prefix>`). Anything else is an unknown
task. Synchronous: callers hop with `database_sync_to_async`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.db.models import Q, QuerySet

from capabilities.access.principal import Principal
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


def owned_by(principal: Principal) -> QuerySet[Job]:
    """Every task the principal's owner may see: their user's, else the principal's own."""
    tasks = Job.objects.filter(call_id__startswith=CALL_ID_PREFIX)
    if principal.user_id is not None:
        return tasks.filter(user_id=principal.user_id)
    return tasks.filter(user__isnull=True, principal=principal.rate_limit_id)


def find(principal: Principal, task_id: str) -> Job | None:
    """One of the owner's tasks; never another's, never a plain call."""
    try:
        job_id = uuid.UUID(task_id)
    except ValueError:
        return None
    return owned_by(principal).filter(pk=job_id).first()


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of an owner's tasks, oldest first."""

    jobs: list[Job]
    next_cursor: str | None
    unknown_cursor: bool = False


def page(principal: Principal, cursor: str | None) -> Page:
    """The owner's tasks after `cursor` (the last task id of the page before)."""
    tasks = owned_by(principal).order_by("created_at", "id")
    if cursor is not None:
        after = find(principal, cursor)
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
