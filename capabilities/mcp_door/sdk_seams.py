"""What the MCP SDK (mcp==2.3.0, pinned) knows and does not yet hand to handlers.

`ServerRequestContext` carries the request's connection (its session id, its
teardown stack) only as a private attribute of its `ServerSession`; the SDK's own
`Context`, which will expose it, is not built for low-level handlers in this
version; nor does the SDK let a server end a session it holds. The reads live here,
so an SDK upgrade changes one file (tests/stack/test_mcp.py and
tests/stack/test_isolation.py cover them).
"""

from __future__ import annotations

from typing import Any

from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import StreamableHTTPServerTransport


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The request's connection: its session id, its teardown stack.

    The Streamable HTTP transport serving it is noted on it (`state`), for
    `end_connection`: the SDK hands it to nobody.
    """
    found = getattr(ctx.session, "_connection", None)
    if not isinstance(found, Connection):
        return None
    if _TRANSPORT not in found.state:
        transport = _transport_of(ctx)
        if transport is not None:
            found.state[_TRANSPORT] = transport
    return found


async def end_connection(connection: Connection) -> bool:
    """End a stateful session from our side, as a DELETE from its client does; False if
    its transport is not known.

    The transport is terminated: from then on a request naming the session is 404,
    its streams close, its dispatcher stops and the connection's teardown stack runs.
    """
    transport = connection.state.get(_TRANSPORT)
    if not isinstance(transport, StreamableHTTPServerTransport):
        return False
    await transport.terminate()
    return True


_TRANSPORT = "abp.transport"


def _transport_of(ctx: ServerRequestContext[Any, Any]) -> StreamableHTTPServerTransport | None:
    # Each message the transport frames carries a hook bound to it (a partial of its
    # `_terminate_unanswered_request`), in the request's dispatch context.
    outbound = getattr(ctx.session, "_request_outbound", None)
    metadata = getattr(outbound, "message_metadata", None)
    hook = getattr(metadata, "on_request_unanswered", None)
    found = getattr(getattr(hook, "func", None), "__self__", None)
    return found if isinstance(found, StreamableHTTPServerTransport) else None
