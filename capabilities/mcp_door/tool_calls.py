"""`tools/call`: one job through the answer core, waited on, cancelled with the request.

The answer core (`calls/answers.py`) starts the job (every limit checked first) so
that a cancel landing during the insert never leaves it running, ends it at its
deadline (a timeout) and cancels it for the client; the watcher hears its progress
and its settle. A request the client cancels (`notifications/cancelled`, a client
timeout, or on 2026-07-28 a closed stream) is cancelled through the same pipeline as
an ABP cancel, source agent: settled first, then the abort flag and the revoke. A
request cut short because its MCP session ended is cancelled with source disconnect.
A `notifications/cancelled` that overtakes its call cancels it too (early_cancels.py).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from capabilities.access.principal import Principal
from capabilities.calls import answers, budgets, start
from capabilities.conf import abp_settings
from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.mcp_door import call_watch, early_cancels, sessions, tools
from capabilities.models import CancelSource, Job
from capabilities.protocol import ErrorCode
from capabilities.work import registry

logger = logging.getLogger(__name__)

PRINCIPAL_SCOPE_KEY = "abp.principal"
CANCEL_REASON = "MCP request cancelled"


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """Run the capability named by the tool; its result, or its error with isError."""
    if registry.get(params.name) is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
    try:
        with early_cancels.running(ctx) as scope:
            result = await _call(ctx, params)
        if not scope.cancelled_caught:
            return result
    except early_cancels.Overtaken:
        pass
    # Cancelled by a `notifications/cancelled` the SDK did not see to (early_cancels.py).
    code, message = jsonrpc_error(ErrorCode.CANCELLED)
    raise MCPError(code, message)


async def _call(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    principal = principal_of(ctx)
    own_session: str | None = None
    try:
        try:
            session_id, own, check = await sessions.session_for_call(ctx, principal)
        except (budgets.OverBudget, start.CallRefused) as refused:
            return tools.refusal_result(refused.error)
        own_session = session_id if own else None
        return await _run(ctx, params, principal, session_id, check)
    finally:
        if own_session is not None:
            with anyio.CancelScope(shield=True):
                await sessions.end_session(own_session)


async def _run(
    ctx: ServerRequestContext[Any, Any],
    params: types.CallToolRequestParams,
    principal: Principal,
    session_id: str,
    check: Callable[[], None] | None,
) -> types.CallToolResult:
    token = progress_token_of(ctx)
    request = call_request(ctx, params, session_id, call_id=str(uuid.uuid4()), progress=token)
    reported = _Reported(ctx)

    def cancel_source() -> CancelSource:
        # Whatever else ends a call's request is the client letting go of it: a
        # `notifications/cancelled`, a client timeout, a closed stream (the 2026 way
        # to cancel). Only a DELETE of its session makes it a disconnect.
        return CancelSource.DISCONNECT if sessions.is_ending(session_id) else CancelSource.AGENT

    try:
        async with call_watch.watching(session_id) as watch:
            try:
                job = await answers.start_for_caller(
                    principal,
                    dataclasses.replace(request, deliver=watch.deliver_here, check=check),
                    cancel_reason=CANCEL_REASON,
                    cancel_source=cancel_source,
                )
            except start.CallRefused as refused:
                return tools.refusal_result(refused.error)
            try:
                with anyio.fail_after(answers.seconds_left(job)):
                    response = await _outcome(
                        watch, job, ctx, reported if token is not None else None
                    )
            except TimeoutError:
                ended = await answers.end_for_caller(job, CancelSource.TIMEOUT, "deadline passed")
                response = ended or await _outcome(watch, job, ctx)
            except anyio.get_cancelled_exc_class():
                await answers.end_for_caller(job, cancel_source(), CANCEL_REASON)
                raise
    except call_watch.CannotWatch:
        # Redis restarting, nothing stored yet: refused as a call whose row cannot be.
        return tools.refusal_result(start.NOT_QUEUED)
    return tools.tool_result(response)


async def _outcome(
    watch: call_watch.CallWatch,
    job: Job,
    ctx: ServerRequestContext[Any, Any],
    reported: _Reported | None = None,
) -> dict[str, Any]:
    return await watch.outcome(
        job,
        base_url=base_url(ctx),
        inline_max_bytes=tools.INLINE_MAX_BYTES,
        on_progress=reported.send if reported is not None else None,
    )


class _Reported:
    """Progress to the client: strictly increasing values (MCP requires it), stage as message."""

    def __init__(self, ctx: ServerRequestContext[Any, Any]) -> None:
        self._ctx = ctx
        self._last: float | None = None

    async def send(self, progress: call_watch.Progress) -> None:
        if self._last is not None and progress.progress <= self._last:
            return
        self._last = progress.progress
        message = progress.stage
        if progress.position is not None:
            message = f"queued, position {progress.position}"
        await self._ctx.session.report_progress(progress.progress, progress.total, message or None)


def call_request(
    ctx: ServerRequestContext[Any, Any],
    params: types.CallToolRequestParams,
    session_id: str,
    *,
    call_id: str,
    progress: str | int | None,
) -> start.CallRequest:
    """The call service's request for a tool call (the capability's own timeout)."""
    return start.CallRequest(
        session_id=session_id,
        call_id=call_id,
        request_id=str(ctx.request_id),
        capability=params.name,
        params=dict(params.arguments or {}),
        timeout_ms=None,
        progress_token=progress,
        notify_started=False,
    )


def principal_of(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """Who made the request (set by the door's authentication, capabilities/mcp_door/app.py)."""
    scope = getattr(ctx.request, "scope", None) or {}
    principal = scope.get(PRINCIPAL_SCOPE_KEY)
    if not isinstance(principal, Principal):
        raise MCPError(types.INTERNAL_ERROR, "The request was not authenticated.")
    return principal


def progress_token_of(ctx: ServerRequestContext[Any, Any]) -> str | int | None:
    """The request's `_meta.progressToken`, if the client asked for progress."""
    meta: Any = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken"))
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def base_url(ctx: ServerRequestContext[Any, Any]) -> str:
    """Where download URLs start: PUBLIC_BASE_URL, else this request's own base."""
    configured: str = abp_settings().PUBLIC_BASE_URL
    if configured:
        return configured
    url = getattr(ctx.request, "base_url", None)
    return str(url).rstrip("/") if url is not None else ""
