"""Two things the MCP SDK (mcp==2.3.0, pinned) knows and does not yet hand to handlers.

`ServerRequestContext` carries the request's dispatch context and its connection
only as private attributes of its `ServerSession`; the SDK's own `Context`, which
will expose them, is not built for low-level handlers in this version. Both reads
live here, so an SDK upgrade changes one file (tests/test_mcp.py covers both).
"""

from __future__ import annotations

from typing import Any

from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext


def peer_cancelled(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client cancelled this request (`notifications/cancelled`)."""
    dispatch = getattr(ctx.session, "_request_outbound", None)
    event = getattr(dispatch, "cancel_requested", None)
    return bool(event is not None and event.is_set())


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The request's connection: its session id, its teardown stack."""
    found = getattr(ctx.session, "_connection", None)
    return found if isinstance(found, Connection) else None
