"""What an MCP task is, on either wire: a job the client polls, seen only by its owner.

A task is a job: its id is the job's id, its status is read from the job row (one
map, `STATUSES`), and it settles once, by the same conditional update as every
call. Its callId marks it as a task and carries the ttl it was granted, which has
no column of its own: `mcp-task:<ttl ms>:<uuid>`. A plain `tools/call` has a bare
uuid, so it is never a task.

A task id is a handle, never a credential (MCP binds tasks to the authorization
context): a task is found, listed, read and cancelled only by its owner. That is
the user it runs for, whichever of their keys, tokens or sessions made it; for a
call that runs for nobody (a service key; development's anonymous callers), the
principal that made it (`key:<prefix>`). Anything else is an unknown task (-32602).

The wires (`tasks.py`, 2025-11-25; `tasks_extension.py`, 2026-07-28) check their
own gates and only shape what this module returns.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from channels.db import database_sync_to_async
from django.db.models import Q, QuerySet
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import methods

from capabilities.access.principal import Principal
from capabilities.calls import answers
from capabilities.conf import abp_settings
from capabilities.endings import cancellation
from capabilities.jobs import lifecycle, results
from capabilities.mcp_door import call_watch, sessions, tool_calls, tools
from capabilities.models import CancelSource, Job, JobStatus

CALL_ID_PREFIX = "mcp-task:"
# Suggested to clients between two polls; most capabilities take seconds.
POLL_INTERVAL_MS = 1000
PAGE_SIZE = 100
CANCEL_REASON = "MCP tasks/cancel"
ABANDONED_REASON = "MCP request cancelled before its task was answered"
# A session-less request's own session row, closed without cancelling once its job exists.
ROW_CLOSED_REASON = "MCP task created"
_SETTLE_NOTES = frozenset({"job.settled", "job.returned"})


class TaskStatus(enum.StrEnum):
    """Where a task is, read from its job's status."""

    WORKING = "working"
    """Queued or running."""
    COMPLETED = "completed"
    """Succeeded: its result is the plain call's."""
    FAILED = "failed"
    """Failed: its result is the plain call's, with `isError`."""
    CANCELLED = "cancelled"
    """Cancelled (by its client, an operator, the deadline, its session's end)."""


STATUSES: dict[str, TaskStatus] = {
    JobStatus.QUEUED: TaskStatus.WORKING,
    JobStatus.RUNNING: TaskStatus.WORKING,
    JobStatus.SUCCEEDED: TaskStatus.COMPLETED,
    JobStatus.FAILED: TaskStatus.FAILED,
    JobStatus.CANCELLED: TaskStatus.CANCELLED,
}


@dataclass(frozen=True, kw_only=True)
class Task:
    """A task as its job row says now (times in ISO 8601)."""

    task_id: str
    # The MCP session's row (or the request's own): where its settle is heard.
    session_id: str
    status: TaskStatus
    status_message: str | None
    created_at: str
    last_updated_at: str
    ttl_ms: int
    # Only while it works.
    poll_interval_ms: int | None


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of an owner's tasks, oldest first."""

    jobs: list[Job]
    next_cursor: str | None
    unknown_cursor: bool = False

    @property
    def tasks(self) -> list[Task]:
        return [task_of(job) for job in self.jobs]


async def create(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, ttl_ms: int | None
) -> Task:
    """Start the call as a job: its task. OverBudget or CallRefused: no job, so no task.

    A request cancelled before the job exists leaves none running: nobody would know
    its task id (`answers.start_for_caller`).
    """
    principal = tool_calls.principal_of(ctx)
    session_id, own_row = await sessions.session_for(ctx, principal)
    call_id = new_call_id(granted_ttl(ttl_ms))
    request = tool_calls.call_request(ctx, params, session_id, call_id=call_id, progress=None)
    job: Job | None = None
    try:
        job = await answers.start_for_caller(principal, request, cancel_reason=ABANDONED_REASON)
        return task_of(job)
    finally:
        if own_row:
            with anyio.CancelScope(shield=True):
                # A task outlives its request; with no job, the row ends as a plain call's.
                await (
                    sessions.let_go(session_id, ROW_CLOSED_REASON)
                    if job is not None
                    else sessions.end_session(session_id)
                )


async def get(principal: Principal, task_id: str) -> Task:
    """One of the owner's tasks, as its row says now."""
    return task_of(await _own(principal, task_id))


async def result(task: Task, base_url: str) -> types.CallToolResult | None:
    """A settled task's result, the same every time; None while it works."""
    if task.status is TaskStatus.WORKING:
        return None
    response = await database_sync_to_async(final_response)(task.task_id, base_url)
    assert response is not None
    return tools.tool_result(response)


async def wait_result(task: Task, base_url: str) -> types.CallToolResult:
    """The result once the task settled. Giving up waiting stops only the wait."""
    read = database_sync_to_async(final_response)
    async with call_watch.watching(task.session_id) as watch:
        while (response := await read(task.task_id, base_url)) is None:
            await _settle_or_quiet(watch)
    return tools.tool_result(response)


async def cancel(principal: Principal, task_id: str) -> bool:
    """Settled cancelled (source agent) on return, then the work stops; False if it had ended."""
    job = await _own(principal, task_id)
    return job.is_active and await cancellation.cancel_for_caller(
        job, CancelSource.AGENT, CANCEL_REASON
    )


async def listed(principal: Principal, cursor: str | None) -> Page:
    """The owner's tasks after `cursor`, oldest first; -32602 for a cursor not theirs."""
    found: Page = await database_sync_to_async(page)(principal, cursor)
    if found.unknown_cursor:
        raise MCPError(types.INVALID_PARAMS, "Unknown cursor.")
    return found


def on_wire(tool_result: types.CallToolResult, protocol_version: str) -> dict[str, Any]:
    """A tool result as a `tools/call` of this protocol version answers it."""
    dumped = tool_result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return methods.serialize_server_result("tools/call", protocol_version, dumped)


async def _own(principal: Principal, task_id: str) -> Job:
    job: Job | None = await database_sync_to_async(find)(principal, task_id)
    if job is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown task: {task_id}")
    return job


async def _settle_or_quiet(watch: call_watch.CallWatch) -> None:
    """Until a call of the session settles, or a quiet spell passes (notes can be lost)."""
    with anyio.move_on_after(call_watch.QUIET_SECONDS):
        while True:
            note = await watch.note(call_watch.QUIET_SECONDS)
            if note is not None and note.get("type") in _SETTLE_NOTES:
                return


def task_of(job: Job) -> Task:
    """The task a job is, as its row says now."""
    updated = job.settled_at or job.started_at or job.created_at
    return Task(
        task_id=str(job.id),
        session_id=str(job.session_id),
        status=STATUSES[job.status],
        status_message=status_message(job),
        created_at=job.created_at.isoformat(),
        last_updated_at=updated.isoformat(),
        ttl_ms=int(job.call_id.removeprefix(CALL_ID_PREFIX).split(":", 1)[0]),
        poll_interval_ms=POLL_INTERVAL_MS if job.is_active else None,
    )


def status_message(job: Job) -> str | None:
    """The stage while it runs; `CODE: message` once it failed or was cancelled."""
    if job.status == JobStatus.QUEUED:
        return "Queued."
    if job.status == JobStatus.RUNNING:
        return job.stage or "Running."
    if job.status == JobStatus.SUCCEEDED:
        return None
    return f"{job.error_code}: {job.error_message}"


def new_call_id(ttl_ms: int) -> str:
    """The callId of a new task granted `ttl_ms`."""
    return f"{CALL_ID_PREFIX}{ttl_ms}:{uuid.uuid4()}"


def granted_ttl(asked_ms: int | None) -> int:
    """As asked, at most JOB_RETENTION_DAYS (job rows are kept that long once settled)."""
    kept = int(abp_settings().JOB_RETENTION_DAYS * 86_400_000)
    return kept if asked_ms is None else max(0, min(asked_ms, kept))


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
