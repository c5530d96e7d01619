"""Tasks on the 2026-07-28 wire: the `io.modelcontextprotocol/tasks` extension (SEP-2663).

The server decides which calls become tasks. Here: a `tools/call` whose request
declares the extension (`_meta["io.modelcontextprotocol/clientCapabilities"]`)
and asks for no progress. A task gets no progress notifications (SEP-2663), so a
client that asked for them is following the call on its stream and gets the
plain call, which also stops when that stream closes.

What a task is, who sees it and how it settles is `task_service.py`'s, as on the
2025 wire. Having no session, a task's request gets a session row of its own,
closed without cancelling once the job exists: a plain 2026 call's row ends with
its request, cancelling what runs in it, and the reaper cancels the calls of open
rows nobody holds; a task outlives its request and holds nothing.

Shapes as the extension's schema has them (modelcontextprotocol/ext-tasks,
schema/draft/schema.ts): a flat `Task` (`ttlMs`, `pollIntervalMs`), a
`CreateTaskResult` tagged `resultType: "task"`, and a `tasks/get` result with the
outcome inlined. A job that failed is a `completed` task whose result has
`isError: true`: the extension keeps `failed` for JSON-RPC errors, and a plain call
answers a failed job with that tool result. `tasks/cancel` does more than the
extension asks: it answers once the job is settled cancelled (source agent), then
the work stops. A task that ended first keeps its outcome (the same empty ack).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types.jsonrpc import HEADER_MISMATCH
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capabilities.access.principal import Principal
from capabilities.calls import budgets, start
from capabilities.mcp_door import task_service, tool_calls, tools
from capabilities.mcp_door.task_service import TaskStatus
from capabilities.work import registry

IDENTIFIER = "io.modelcontextprotocol/tasks"
_VERSIONS = frozenset(MODERN_PROTOCOL_VERSIONS)


class TaskParams(types.RequestParams):
    """`tasks/get` and `tasks/cancel`: `{taskId}`."""

    task_id: str


class UpdateTaskParams(TaskParams):
    """`tasks/update`: `{taskId, inputResponses}`."""

    input_responses: dict[str, Any]


class TasksExtension(Extension):
    """`tasks/get`, `tasks/update`, `tasks/cancel`, and the task branch of `tools/call`."""

    identifier = IDENTIFIER

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, get_task, _VERSIONS),
            MethodBinding("tasks/update", UpdateTaskParams, update_task, _VERSIONS),
            MethodBinding("tasks/cancel", TaskParams, cancel_task, _VERSIONS),
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
    declared = capabilities is not None and IDENTIFIER in (capabilities.extensions or {})
    return (
        ctx.protocol_version in _VERSIONS
        and declared
        and tool_calls.progress_token_of(ctx) is None
        and registry.get(params.name) is not None
    )


async def start_task(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> HandlerResult:
    """Start the call as a job; its task (ttl: the job retention), or a plain call's refusal."""
    try:
        task = await task_service.create(ctx, params, None)
    except (budgets.OverBudget, start.CallRefused) as refused:
        return tools.refusal_result(refused.error)
    return {"resultType": "task", **_fields(task)}


async def get_task(ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
    """`tasks/get`: the task as its job row says now, its tool result once it completed."""
    task = await task_service.get(_principal(ctx, params.task_id), params.task_id)
    result, fields = await task_service.result(task, tool_calls.base_url(ctx)), _fields(task)
    if fields["status"] == TaskStatus.COMPLETED:
        assert result is not None
        fields["result"] = task_service.on_wire(result, ctx.protocol_version)
    return {"resultType": "complete", **fields}


async def update_task(
    ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
) -> dict[str, Any]:
    """`tasks/update`: no job asks for input, so no key is outstanding; ignored (SEP-2663)."""
    await task_service.get(_principal(ctx, params.task_id), params.task_id)
    return {}


async def cancel_task(ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
    """`tasks/cancel`: an empty ack, sent once the job is settled (cancelled, or its own end)."""
    await task_service.cancel(_principal(ctx, params.task_id), params.task_id)
    return {}


def _principal(ctx: ServerRequestContext[Any, Any], task_id: str) -> Principal:
    """Who asks, if the request declares the extension and is routed to `task_id`."""
    require_client_extension(ctx, IDENTIFIER)
    headers = getattr(ctx.request, "headers", None)
    routed_to = headers.get(MCP_NAME_HEADER) if headers is not None else None
    if routed_to is not None and decode_header_value(routed_to) != task_id:
        raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} does not match the taskId.")
    return tool_calls.principal_of(ctx)


def _fields(task: task_service.Task) -> dict[str, Any]:
    """The extension's flat `Task`: a failed job is `completed` (its result says `isError`)."""
    status = TaskStatus.COMPLETED if task.status is TaskStatus.FAILED else task.status
    fields: dict[str, Any] = {
        "taskId": task.task_id,
        "status": str(status),
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttlMs": task.ttl_ms,
    }
    if task.status_message is not None:
        fields["statusMessage"] = task.status_message
    if task.poll_interval_ms is not None:
        fields["pollIntervalMs"] = task.poll_interval_ms
    return fields
