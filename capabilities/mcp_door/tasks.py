"""Tasks (MCP 2025-11-25): a `tools/call` with `params.task` is a job the client polls.

A task is a job: its id is the job's id, its status is read from the job row, and
it settles once, by the same conditional update as every call. `tasks/cancel`
settles it as cancelled (source agent) before answering, then stops the work.
A task outlives the request that created it and ends with its MCP session
(cancelled, source disconnect, by `sessions.end_session`). Only its owner sees it:
the user it runs for, from any of their sessions and keys, or for a service key that
key (`task_rows.owned_by`); to anyone else it is an unknown task (-32602), and
`tasks/list` lists the owner's tasks alone. Only the 2025-11-25 wire has
these tasks: elsewhere `params.task` is ignored, `tasks/result` and `tasks/list`
are not found, and on 2026-07-28 `tasks/get` and `tasks/cancel` are the tasks
extension's (`tasks_extension.py`).

SDK 2.3.0 types tasks but dispatches none of them. `tasks/*` are served as custom
methods. A task-augmented `tools/call` is answered by a server middleware: a
`tools/call` handler's result is checked against `CallToolResult`, which a
`CreateTaskResult` fails. The same middleware adds the `tasks` capability to the
`initialize` result, which the SDK never advertises.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from channels.db import database_sync_to_async
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import methods

from capabilities.calls import answers, budgets, cancellation, start
from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.mcp_door import call_watch, sdk_seams, sessions, task_rows, tool_calls, tools
from capabilities.models import CancelSource, Job
from capabilities.protocol import WireError
from capabilities.work import registry

TASKS_VERSION = "2025-11-25"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
CANCEL_REASON = "MCP tasks/cancel"
ABANDONED_REASON = "MCP request cancelled before its task was answered"
CAPABILITY = types.ServerTasksCapability(
    list=types.TasksListCapability(),
    cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(
        tools=types.TasksToolsCapability(call=types.TasksCallCapability())
    ),
).model_dump(by_alias=True, mode="json", exclude_none=True)
_SETTLE_NOTES = frozenset({"job.settled", "job.returned"})


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
    principal = tool_calls.principal_of(ctx)
    try:
        session_id, _ = await sessions.session_for(ctx, principal)
    except budgets.OverBudget as over:
        raise _refused(over.error) from None
    call_id = task_rows.new_call_id(_ttl_granted(params.task))
    request = tool_calls.call_request(ctx, params, session_id, call_id=call_id, progress=None)
    try:
        # A request cancelled before it is answered leaves no task nobody knows of.
        job = await answers.start_for_caller(principal, request, cancel_reason=ABANDONED_REASON)
    except start.CallRefused as refused:
        raise _refused(refused.error) from None
    return types.CreateTaskResult(task=task_rows.task_of(job))


def _ttl_granted(task: types.TaskMetadata) -> int:
    """As asked, at most JOB_RETENTION_DAYS: job rows are kept that long after they settle."""
    kept = task_rows.retention_ms()
    return kept if task.ttl is None else max(0, min(task.ttl, kept))


def _refused(error: WireError) -> MCPError:
    # No job, so no task: the request itself fails, with the ABP error as data and the
    # code /abp/rpc answers it with (the one table).
    code, _ = jsonrpc_error(error.code)
    return MCPError(code, error.message, data=error.to_json())


async def get_task(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
) -> types.GetTaskResult:
    """`tasks/get`: the task as its job row says now."""
    job = await _own_task(ctx, params.task_id)
    return types.GetTaskResult.model_validate(task_rows.task_of(job).model_dump())


async def task_result(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
) -> dict[str, Any]:
    """`tasks/result`: once the job settled, the result a plain `tools/call` would have had.

    The client giving up waiting stops only the wait: the task runs on.
    """
    job = await _own_task(ctx, params.task_id)
    job_id, base_url = str(job.id), tool_calls.base_url(ctx)
    async with call_watch.watching(str(job.session_id)) as watch:
        while (response := await _final_response(job_id, base_url)) is None:
            await _settle_or_quiet(watch)
    # The plain call's result, shaped as the 2025 wire has it, naming its task.
    result = tools.tool_result(response).model_copy(
        update={"meta": {RELATED_TASK_META: {"taskId": job_id}}}
    )
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return methods.serialize_server_result("tools/call", ctx.protocol_version, dumped)


async def _final_response(job_id: str, base_url: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = await database_sync_to_async(task_rows.final_response)(
        job_id, base_url
    )
    return found


async def _settle_or_quiet(watch: call_watch.CallWatch) -> None:
    """Until a call of the session settles, or a quiet spell passes (notes can be lost)."""
    with anyio.move_on_after(call_watch.QUIET_SECONDS):
        while True:
            note = await watch.note(call_watch.QUIET_SECONDS)
            if note is not None and note.get("type") in _SETTLE_NOTES:
                return


async def cancel_task(
    ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
) -> types.CancelTaskResult:
    """`tasks/cancel`: settled as cancelled (source agent) before the answer; -32602 if it ended."""
    job = await _own_task(ctx, params.task_id)
    if job.is_active and await cancellation.cancel_for_caller(
        job, CancelSource.AGENT, CANCEL_REASON
    ):
        cancelled = await _own_task(ctx, params.task_id)
        return types.CancelTaskResult.model_validate(task_rows.task_of(cancelled).model_dump())
    ended = task_rows.task_of(await _own_task(ctx, params.task_id))
    raise MCPError(types.INVALID_PARAMS, f"Task {ended.task_id} has already ended: {ended.status}.")


async def list_tasks(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
) -> types.ListTasksResult:
    """`tasks/list`: the caller's own tasks (`task_rows.owned_by`), oldest first, a page
    at a time."""
    _require_tasks(ctx)
    page: task_rows.Page = await database_sync_to_async(task_rows.page)(
        tool_calls.principal_of(ctx), params.cursor
    )
    if page.unknown_cursor:
        raise MCPError(types.INVALID_PARAMS, "Unknown cursor.")
    return types.ListTasksResult(
        tasks=[task_rows.task_of(job) for job in page.jobs], next_cursor=page.next_cursor
    )


async def _own_task(ctx: ServerRequestContext[Any, Any], task_id: str) -> Job:
    """A task of this request's owner; -32602 for any other id, as for an unknown one."""
    _require_tasks(ctx)
    job: Job | None = await database_sync_to_async(task_rows.find)(
        tool_calls.principal_of(ctx), task_id
    )
    if job is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown task: {task_id}")
    return job


def _require_tasks(ctx: ServerRequestContext[Any, Any]) -> None:
    if ctx.protocol_version != TASKS_VERSION:
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found", data=ctx.method)
