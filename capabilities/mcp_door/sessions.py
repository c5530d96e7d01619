"""An MCP session's row: its jobs belong to a session, as an ABP connection's do.

A stateful MCP session (2025 handshake era) gets one `AgentSession` (door MCP),
with the MCP session id as its id, made on its first tool call and ended with
it (DELETE, the idle timeout, shutdown): its calls still running are then
cancelled with source disconnect. While it lives, this Daphne keeps it seen, so
the reaper leaves it alone. A session-less request (2026-07-28) gets a row of its
own for its one call.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from channels.db import database_sync_to_async
from mcp.server.context import ServerRequestContext

from capabilities.access.principal import Principal
from capabilities.calls import budgets, cancellation, held_sessions, session_records
from capabilities.mcp_door import sdk_seams
from capabilities.models import AgentSession, CancelSource, Door

logger = logging.getLogger(__name__)

ENDED_REASON = "MCP session ended"
_open: set[str] = set()
# Sessions a client is deleting: their calls cut short are disconnects, not cancels.
_ending: set[str] = set()


async def session_for(
    ctx: ServerRequestContext[Any, Any], principal: Principal
) -> tuple[str, bool]:
    """The session row of this request's MCP session, and whether it is this call's own.

    OverBudget (RATE_LIMITED) if the principal has its most sessions open.
    """
    connection = sdk_seams.connection_of(ctx)
    session_id = session_id_of(ctx)
    if session_id is None or connection is None:
        session_id = str(uuid.uuid4())
        await database_sync_to_async(_create)(session_id, ctx, principal)
        return session_id, True
    if session_id not in _open:
        await database_sync_to_async(_create)(session_id, ctx, principal)
        _open.add(session_id)
        held_sessions.hold(_holder(session_id), session_id)

        async def end() -> None:
            await end_session(session_id)

        connection.exit_stack.push_async_callback(end)
    return session_id, False


def session_id_of(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The session row id of this request's MCP session; None without one (2026-07-28)."""
    connection = sdk_seams.connection_of(ctx)
    if connection is None or connection.session_id is None:
        return None
    return str(uuid.UUID(hex=connection.session_id))


def mark_ending(mcp_session_id: str) -> None:
    """A DELETE for this MCP session arrived (before the SDK ends it)."""
    try:
        _ending.add(str(uuid.UUID(hex=mcp_session_id)))
    except ValueError:
        return


def is_ending(session_id: str) -> bool:
    """Whether the session's client is ending it (DELETE)."""
    return session_id in _ending


async def end_session(session_id: str) -> None:
    """The MCP session is over: cancel what still runs, and record the end."""
    _open.discard(session_id)
    _ending.discard(session_id)
    held_sessions.release(_holder(session_id))
    await database_sync_to_async(_end)(session_id)


def _holder(session_id: str) -> str:
    return f"mcp:{session_id}"


def _create(session_id: str, ctx: ServerRequestContext[Any, Any], principal: Principal) -> None:
    if AgentSession.objects.filter(pk=session_id).exists():
        return
    budgets.refuse_another_session(principal)
    client = ctx.session.client_params.client_info if ctx.session.client_params else None
    headers = getattr(ctx.request, "headers", {}) or {}
    session_records.record_session(
        session_id,
        principal,
        door=Door.MCP,
        agent=(client.name, client.version) if client else ("", ""),
        protocol_version=ctx.protocol_version,
        origin=str(headers.get("origin", "")),
    )


def _end(session_id: str) -> None:
    session_records.close_session(session_id, ENDED_REASON)
    cancellation.cancel_session_calls(
        session_id, source=CancelSource.DISCONNECT, reason=ENDED_REASON
    )
    logger.info("MCP session %s ended", session_id)
