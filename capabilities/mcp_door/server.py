"""The MCP server: tools from the registry, calls through the call service."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from channels.db import database_sync_to_async
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from capabilities.access import visibility
from capabilities.calls import availability
from capabilities.conf import abp_settings
from capabilities.mcp_door import (
    early_cancels,
    extensions,
    sessions,
    tasks,
    tasks_extension,
    tool_calls,
    tools,
)


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """Each capability the caller may call, as a tool; `_meta["abp/available"]` false
    where no worker runs it."""
    snapshot = await database_sync_to_async(availability.for_listing)()
    shown = await visibility.names_for_async(tool_calls.principal_of(ctx))
    listed = [tool for tool in tools.tool_list(snapshot.states()) if tool.name in shown]
    # The list is the caller's own (their scopes and permissions): on 2026-07-28, no
    # cache may share it across authorization contexts.
    return types.ListToolsResult(tools=listed, cache_scope="private")


def build() -> Server[Any]:
    """The low-level server of this process."""
    abp = abp_settings()
    server: Server[Any] = Server(
        abp.APP_ID,
        version=abp.APP_VERSION,
        title=abp.APP_NAME,
        description=abp.APP_DESCRIPTION,
        on_list_tools=list_tools,
        on_call_tool=tool_calls.call_tool,
    )
    tasks.register(server)
    extensions.apply(server, tasks_extension.TasksExtension())
    # A stateful session's row is written (or refused: no room) when it initializes.
    server.middleware.append(sessions.admit_at_initialize(tool_calls.principal_of))
    # A cancel that overtakes its call (2025-11-25) still cancels it.
    server.add_notification_handler(
        "notifications/cancelled", types.CancelledNotificationParams, early_cancels.on_cancelled
    )
    return server
