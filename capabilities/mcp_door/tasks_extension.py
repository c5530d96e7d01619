"""Tasks on the 2026-07-28 wire: the `io.modelcontextprotocol/tasks` extension (SEP-2663).

The server decides which calls become tasks. Here: a `tools/call` whose request
declares the extension (`_meta["io.modelcontextprotocol/clientCapabilities"]`)
and asks for no progress. A task gets no progress notifications (SEP-2663), so a
client that asked for them is following the call on its stream and gets the
plain call, which also stops when that stream closes.

A task is a job, as on the 2025 wire (`tasks.py`), bound the same way: to the user
it runs for, or to the service key that made it (`task_rows.owned_by`); anyone
else's task id is an unknown task. One difference comes from having no session: its
per-call session row is closed, without cancelling, once the job exists: a plain
2026 call's row ends with its request, cancelling what runs in it, and the reaper
cancels the calls of open rows nobody holds; a task outlives its request and
holds nothing.

`tasks/cancel` does more than the extension asks: it answers once the job is
settled cancelled (source agent), then the work stops; the task stays cancelled.
A task that ended first keeps its outcome (the answer is the same empty ack).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
from channels.db import database_sync_to_async
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import methods
from mcp_types.jsonrpc import HEADER_MISMATCH
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capabilities.calls import (
    answers,
    budgets,
    cancellation,
    start,
)
from capabilities.mcp_door import sessions, task_rows, tasks_wire, tool_calls, tools
from capabilities.models import CancelSource, Job
from capabilities.work import registry

CANCEL_REASON = "MCP tasks/cancel"
ABANDONED_REASON = "MCP request cancelled before its task was answered"
# The per-call session row of a task, closed once its job exists.
ROW_CLOSED_REASON = "MCP task created"
_VERSIONS = frozenset(MODERN_PROTOCOL_VERSIONS)


class TasksExtension(Extension):
    """`tasks/get`, `tasks/update`, `tasks/cancel`, and the task branch of `tools/call`."""

    identifier = tasks_wire.IDENTIFIER

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", tasks_wire.TaskParams, get_task, _VERSIONS),
            MethodBinding("tasks/update", tasks_wire.UpdateTaskParams, update_task, _VERSIONS),
            MethodBinding("tasks/cancel", tasks_wire.TaskParams, cancel_task, _VERSIONS),
        ]

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if not _runs_as_task(ctx, params):
            return await call_next(ctx)
        return await start_task(ctx, params)


def _runs_as_task(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> bool:
    capabilities = ctx.session.client_capabilities
    declared = capabilities is not None and tasks_wire.IDENTIFIER in (capabilities.extensions or {})
    return (
        ctx.protocol_version in _VERSIONS
        and declared
        and tool_calls.progress_token_of(ctx) is None
        and registry.get(params.name) is not None
    )


async def start_task(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> HandlerResult:
    """Start the call as a job; its task, or the refusal a plain call would have had.

    A request cancelled before the job exists leaves none running: nobody would
    know its task id (`answers.start_for_caller`).
    """
    principal = tool_calls.principal_of(ctx)
    try:
        session_id, own_row = await sessions.session_for(ctx, principal)
    except (budgets.OverBudget, start.CallRefused) as refused:
        return tools.refusal_result(refused.error)
    call_id = task_rows.new_call_id(task_rows.retention_ms())
    request = tool_calls.call_request(ctx, params, session_id, call_id=call_id, progress=None)
    job: Job | None = None
    try:
        job = await answers.start_for_caller(principal, request, cancel_reason=ABANDONED_REASON)
    except start.CallRefused as refused:
        return tools.refusal_result(refused.error)
    finally:
        if own_row:
            with anyio.CancelScope(shield=True):
                # No job (refused, or cancelled): the row ends as a plain call's does.
                await (
                    sessions.let_go(session_id, ROW_CLOSED_REASON)
                    if job is not None
                    else sessions.end_session(session_id)
                )
    return tasks_wire.created(job)


async def get_task(
    ctx: ServerRequestContext[Any, Any], params: tasks_wire.TaskParams
) -> dict[str, Any]:
    """`tasks/get`: the task as its job row says now, its tool result once it completed."""
    job = await _own_task(ctx, params.task_id)
    return tasks_wire.detailed(job, await _tool_result(ctx, job))


async def update_task(
    ctx: ServerRequestContext[Any, Any], params: tasks_wire.UpdateTaskParams
) -> dict[str, Any]:
    """`tasks/update`: no job asks for input, so no key is outstanding; ignored (SEP-2663)."""
    await _own_task(ctx, params.task_id)
    return {}


async def cancel_task(
    ctx: ServerRequestContext[Any, Any], params: tasks_wire.TaskParams
) -> dict[str, Any]:
    """`tasks/cancel`: an empty ack, sent once the job is settled (cancelled, or its own end)."""
    job = await _own_task(ctx, params.task_id)
    if job.is_active:
        await cancellation.cancel_for_caller(job, CancelSource.AGENT, CANCEL_REASON)
    return {}


async def _own_task(ctx: ServerRequestContext[Any, Any], task_id: str) -> Job:
    """A task of this request's owner; -32602 for any other id, as for an unknown one."""
    require_client_extension(ctx, tasks_wire.IDENTIFIER)
    headers = getattr(ctx.request, "headers", None)
    routed_to = headers.get(MCP_NAME_HEADER) if headers is not None else None
    if routed_to is not None and decode_header_value(routed_to) != task_id:
        raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} does not match the taskId.")
    job: Job | None = await database_sync_to_async(task_rows.find)(
        tool_calls.principal_of(ctx), task_id
    )
    if job is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown task: {task_id}")
    return job


async def _tool_result(ctx: ServerRequestContext[Any, Any], job: Job) -> dict[str, Any] | None:
    """A settled task's result, as a plain `tools/call` would have answered; None while active."""
    if job.is_active:
        return None
    response: dict[str, Any] | None = await database_sync_to_async(task_rows.final_response)(
        str(job.id), tool_calls.base_url(ctx)
    )
    assert response is not None
    dumped = tools.tool_result(response).model_dump(by_alias=True, mode="json", exclude_none=True)
    return methods.serialize_server_result("tools/call", ctx.protocol_version, dumped)
