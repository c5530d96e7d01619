"""What the MCP SDK (mcp==2.3.0, pinned) knows and does not yet hand to handlers.

`ServerRequestContext` carries the request's connection (its session id, its
teardown stack) only as a private attribute of its `ServerSession`; the SDK's own
`Context`, which will expose it, is not built for low-level handlers in this
version. The read lives here, so an SDK upgrade changes one file
(tests/stack/test_mcp.py covers it).
"""

from __future__ import annotations

from typing import Any

from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The request's connection: its session id, its teardown stack."""
    found = getattr(ctx.session, "_connection", None)
    return found if isinstance(found, Connection) else None
