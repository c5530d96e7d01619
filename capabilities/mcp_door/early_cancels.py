"""Cancels that overtake their call on the 2025 wire.

A `notifications/cancelled` travels in a POST of its own, so it can reach the server
before the `tools/call` it names, which came in another POST a moment earlier. The
SDK cancels only the requests it holds in flight and drops any other cancel: the
call would then run to its end, for a client that had let go of it. So a cancel
that names no call running here is remembered for a while, and the call, when it
comes, is answered -32800 with nothing stored; a cancel that comes while the call
runs but behind the SDK's back (its handler started after the SDK looked) cancels
it as the SDK's own would. Everything here runs on the event loop's thread.
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

from capabilities.mcp_door import sessions

# A cancel can overtake its call by the time of one request's trip: far less than this.
REMEMBER_SECONDS = 30.0
# Bounded whatever clients send: the oldest are forgotten first.
MOST_REMEMBERED = 10_000

_Key = tuple[str, Any]
# Cancels of calls not seen yet, and calls already over (a late cancel changes nothing).
_early: OrderedDict[_Key, float] = OrderedDict()
_over: OrderedDict[_Key, float] = OrderedDict()
_running: dict[_Key, anyio.CancelScope] = {}


class Overtaken(Exception):
    """The call's cancel came before the call."""


async def on_cancelled(
    ctx: ServerRequestContext[Any, Any], params: types.CancelledNotificationParams
) -> None:
    """`notifications/cancelled`: cancel the call it names, now or when it comes."""
    key = _key_of(ctx, params.request_id)
    if key is None:
        return
    running = _running.get(key)
    if running is not None:
        running.cancel()
    elif key not in _over:
        _remember(_early, key)


@contextlib.contextmanager
def running(ctx: ServerRequestContext[Any, Any]) -> Iterator[anyio.CancelScope]:
    """The call's own cancel scope while it runs; Overtaken if it was cancelled already."""
    key = _key_of(ctx, ctx.request_id)
    if key is not None and _early.pop(key, None) is not None:
        raise Overtaken
    with anyio.CancelScope() as scope:
        if key is not None:
            _running[key] = scope
        try:
            yield scope
        finally:
            if key is not None and _running.get(key) is scope:
                del _running[key]
                _remember(_over, key)


def _key_of(ctx: ServerRequestContext[Any, Any], request_id: Any) -> _Key | None:
    session_id = sessions.session_id_of(ctx)
    if session_id is None or request_id is None:
        return None  # session-less: a cancel is the call's own stream closing
    return (session_id, coerce_request_id(request_id))


def _remember(keys: OrderedDict[_Key, float], key: _Key) -> None:
    """Add `key`; forget what is older than REMEMBER_SECONDS, or past MOST_REMEMBERED."""
    now = time.monotonic()
    keys[key] = now
    keys.move_to_end(key)
    while keys and (
        len(keys) > MOST_REMEMBERED or next(iter(keys.values())) < now - REMEMBER_SECONDS
    ):
        keys.popitem(last=False)
