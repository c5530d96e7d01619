"""Step-up: a `tools/call` whose capability needs OAuth scopes the token lacks is a 403.

MCP's authorization spec has the server answer `403 insufficient_scope` naming every
scope the call needs, before the response starts, so the client can ask the user for
them and try again (SEP-2350). The request body is read ahead (as far as the SDK's own
bound), looked at, and handed on unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Scope

from capabilities.access.principal import Principal
from capabilities.conf import abp_settings


async def read_ahead(receive: Receive) -> tuple[bytes, Receive]:
    """The body (up to the frame bound), and a receive that replays what was read."""
    messages: list[Message] = []
    body = b""
    limit = abp_settings().MAX_FRAME_BYTES
    while len(body) <= limit:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return body, replay


def missing_scopes(principal: Principal, body: bytes) -> tuple[str, ...]:
    """The scopes a `tools/call` in `body` needs that the principal's token lacks."""
    if principal.kind != "token" or not body:
        return ()
    try:
        message: Any = json.loads(body)
    except ValueError:
        return ()  # the SDK answers a malformed body
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return ()
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return principal.missing_scopes(name) if isinstance(name, str) else ()


def needs_checking(scope: Scope, principal: Principal) -> bool:
    """Only a token's POST can be a call that needs more scopes."""
    return principal.kind == "token" and scope.get("method") == "POST"
