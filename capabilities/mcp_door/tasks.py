"""Tasks (MCP 2025-11-25): a `tools/call` with `params.task` is a job the client polls.

What a task is, who sees it and how it settles is `task_service.py`'s; this wire
adds its gates and its shapes (the SDK's types). `tasks/cancel` answers the task
settled cancelled, or -32602 if it had ended. A task ends with its MCP session
(cancelled, source disconnect, by `sessions.end_session`). Only the 2025-11-25
wire has these tasks: elsewhere `params.task` is ignored, `tasks/result` and
`tasks/list` are not found, and on 2026-07-28 `tasks/get` and `tasks/cancel` are
the tasks extension's (`tasks_extension.py`).

SDK 2.3.0 types tasks but dispatches none of them. `tasks/*` are served as custom
methods. A task-augmented `tools/call` is answered by a server middleware: a
`tools/call` handler's result is checked against `CallToolResult`, which a
`CreateTaskResult` fails. The same middleware adds the `tasks` capability to the
`initialize` result, which the SDK never advertises.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import methods

from capabilities.access.principal import Principal
from capabilities.calls import budgets, start
from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.mcp_door import sdk_seams, sessions, task_service, tool_calls
from capabilities.work import registry

TASKS_VERSION = "2025-11-25"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
CAPABILITY = types.ServerTasksCapability(
    list=types.TasksListCapability(),
    cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(
        tools=types.TasksToolsCapability(call=types.TasksCallCapability())
    ),
).model_dump(by_alias=True, mode="json", exclude_none=True)


def register(server: Server[Any]) -> None:
    """Serve task-augmented `tools/call` and `tasks/*`; advertise them in `initialize`."""
    server.middleware.append(_tasks_middleware)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, get_task)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, task_result)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, cancel_task)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, list_tasks)


async def _tasks_middleware(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    if ctx.method == "initialize":
        return _advertised(await call_next(ctx))
    if ctx.method == "tools/call" and _asks_for_task(ctx):
        return await start_task(ctx)
    return await call_next(ctx)


def _advertised(result: HandlerResult) -> HandlerResult:
    """The `initialize` result, with the `tasks` capability if 2025-11-25 was agreed."""
    if not isinstance(result, dict) or result.get("protocolVersion") != TASKS_VERSION:
        return result
    return {**result, "capabilities": {**result.get("capabilities", {}), "tasks": CAPABILITY}}


def _asks_for_task(ctx: ServerRequestContext[Any, Any]) -> bool:
    # Past the handshake only: before it, the runner's own gate refuses the call.
    connection = sdk_seams.connection_of(ctx)
    return (
        ctx.protocol_version == TASKS_VERSION
        and (ctx.params or {}).get("task") is not None
        and connection is not None
        and connection.initialize_accepted
        and sessions.session_id_of(ctx) is not None
    )


async def start_task(ctx: ServerRequestContext[Any, Any]) -> types.CreateTaskResult:
    """Start the call as a job and answer at once with its task."""
    # What the runner checks before a handler runs: the 2025 schema, then the model.
    methods.validate_client_request("tools/call", ctx.protocol_version, ctx.params)
    params = types.CallToolRequestParams.model_validate(ctx.params or {}, by_name=False)
    assert params.task is not None
    if registry.get(params.name) is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    try:
        task = await task_service.create(ctx, params, params.task.ttl)
    except (budgets.OverBudget, start.CallRefused) as refused:
        # No job, so no task: the request itself fails, with the ABP error as data and
        # the code /abp/rpc answers it with (the one table).
        code, _ = jsonrpc_error(refused.error.code)
        raise MCPError(code, refused.error.message, data=refused.error.to_json()) from None
    return types.CreateTaskResult(task=types.Task.model_validate(_fields(task)))


async def get_task(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
) -> types.GetTaskResult:
    """`tasks/get`: the task as its job row says now."""
    task = await task_service.get(_principal(ctx), params.task_id)
    return types.GetTaskResult.model_validate(_fields(task))


async def task_result(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
) -> dict[str, Any]:
    """`tasks/result`: once the job settled, the result a plain `tools/call` would have had."""
    task = await task_service.get(_principal(ctx), params.task_id)
    result = await task_service.wait_result(task, tool_calls.base_url(ctx))
    # Shaped as the 2025 wire has it, naming its task.
    named = result.model_copy(update={"meta": {RELATED_TASK_META: {"taskId": task.task_id}}})
    return task_service.on_wire(named, ctx.protocol_version)


async def cancel_task(
    ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
) -> types.CancelTaskResult:
    """`tasks/cancel`: settled as cancelled (source agent) before the answer; -32602 if it ended."""
    principal = _principal(ctx)
    won = await task_service.cancel(principal, params.task_id)
    task = await task_service.get(principal, params.task_id)
    if not won:
        raise MCPError(
            types.INVALID_PARAMS, f"Task {task.task_id} has already ended: {task.status}."
        )
    return types.CancelTaskResult.model_validate(_fields(task))


async def list_tasks(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
) -> types.ListTasksResult:
    """`tasks/list`: the caller's own tasks, oldest first, a page at a time."""
    page = await task_service.listed(_principal(ctx), params.cursor)
    return types.ListTasksResult(
        tasks=[types.Task.model_validate(_fields(task)) for task in page.tasks],
        next_cursor=page.next_cursor,
    )


def _fields(task: task_service.Task) -> dict[str, Any]:
    """A task's fields as the SDK's `Task` names them."""
    return {
        "task_id": task.task_id,
        "status": task.status,
        "status_message": task.status_message,
        "created_at": task.created_at,
        "last_updated_at": task.last_updated_at,
        "ttl": task.ttl_ms,
        "poll_interval": task.poll_interval_ms,
    }


def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """Who asks, once this wire has tasks at all (else -32601)."""
    if ctx.protocol_version != TASKS_VERSION:
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found", data=ctx.method)
    return tool_calls.principal_of(ctx)
