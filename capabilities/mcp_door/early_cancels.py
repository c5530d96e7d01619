"""One MCP session's calls by request id: a cancel that overtakes its call is held for it.

On the 2025 wire a `notifications/cancelled` travels in a POST of its own, so it can
reach the server before the `tools/call` it names. The SDK cancels only the requests
it holds in flight and drops any other cancel: the call would then run to its end,
for a client that had let go of it. So each stateful session keeps a table of its
calls (on its SDK connection, no process-wide state), in the phases of the session
core's (capabilities/session/calls.py): a cancel naming no call yet is held, as in a
call still starting, and the call, when it comes, is answered -32800 with nothing
stored; a cancel while the call runs cancels its scope; a call over is remembered a
while, so a late cancel changes nothing. Everything here runs on the event loop.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.dispatcher import coerce_request_id

from capabilities.mcp_door import sdk_seams
from capabilities.session.calls import Phase

# A cancel can overtake its call by the time of one request's trip: far less than this.
REMEMBER_SECONDS = 30.0
# Bounded whatever a client sends: the oldest are forgotten first.
MOST_REMEMBERED = 10_000
_TABLE = "abp.calls"


class Overtaken(Exception):
    """The call's cancel came before the call."""


class RequestTable:
    """One session's calls by request id: held cancels, running scopes, calls over."""

    def __init__(self) -> None:
        self._running: dict[Any, anyio.CancelScope] = {}
        # Cancels held for calls not seen yet (Phase.CANCELLED_EARLY), and calls over.
        self._held: OrderedDict[Any, float] = OrderedDict()
        self._over: OrderedDict[Any, float] = OrderedDict()

    def phase_of(self, request_id: Any) -> Phase | None:
        if request_id in self._running:
            return Phase.IN_FLIGHT
        return Phase.CANCELLED_EARLY if request_id in self._held else None

    def cancel(self, request_id: Any) -> None:
        """Cancel the call now, or hold the cancel for when it comes."""
        running = self._running.get(request_id)
        if running is not None:
            running.cancel()
        elif request_id not in self._over:
            _remember(self._held, request_id)

    @contextlib.contextmanager
    def running(self, request_id: Any) -> Iterator[anyio.CancelScope]:
        """The call's cancel scope while it runs; Overtaken if its cancel was held."""
        if self._held.pop(request_id, None) is not None:
            _remember(self._over, request_id)
            raise Overtaken
        with anyio.CancelScope() as scope:
            self._running[request_id] = scope
            try:
                yield scope
            finally:
                if self._running.get(request_id) is scope:
                    del self._running[request_id]
                    _remember(self._over, request_id)


async def on_cancelled(
    ctx: ServerRequestContext[Any, Any], params: types.CancelledNotificationParams
) -> None:
    """`notifications/cancelled`: cancel the call it names, now or when it comes."""
    table = _table_of(ctx)
    if table is not None and params.request_id is not None:
        table.cancel(coerce_request_id(params.request_id))


@contextlib.contextmanager
def running(ctx: ServerRequestContext[Any, Any]) -> Iterator[anyio.CancelScope]:
    """The call's own cancel scope while it runs; Overtaken if it was cancelled already."""
    table = _table_of(ctx)
    if table is None or ctx.request_id is None:
        # Session-less: a cancel is the call's own stream closing.
        with anyio.CancelScope() as scope:
            yield scope
        return
    with table.running(coerce_request_id(ctx.request_id)) as scope:
        yield scope


def _table_of(ctx: ServerRequestContext[Any, Any]) -> RequestTable | None:
    """The session's table, kept on its SDK connection (None without a session)."""
    connection = sdk_seams.connection_of(ctx)
    if connection is None or connection.session_id is None:
        return None
    table = connection.state.get(_TABLE)
    if not isinstance(table, RequestTable):
        table = connection.state[_TABLE] = RequestTable()
    return table


def _remember(keys: OrderedDict[Any, float], key: Any) -> None:
    """Add `key`; forget what is older than REMEMBER_SECONDS, or past MOST_REMEMBERED."""
    now = time.monotonic()
    keys[key] = now
    keys.move_to_end(key)
    while keys and (
        len(keys) > MOST_REMEMBERED or next(iter(keys.values())) < now - REMEMBER_SECONDS
    ):
        keys.popitem(last=False)
