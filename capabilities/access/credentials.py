"""Who opened a WebSocket: an agent key, a page token, or (development) nobody.

An agent key acts for its owner, a page token for the user the page was served to
(access/principal.py); a session cookie alone authenticates nothing here.

The credential comes, in this order, from `Authorization: Bearer <credential>`, a
subprotocol `abp.bearer.<credential>` (browsers cannot set headers; they offer
`["abp", "abp.bearer.<credential>"]` and we select `abp`), or the query parameter
`access_token` (for clients that can do neither; it ends up in access logs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from capabilities.access import agent_keys, page_tokens
from capabilities.access.principal import Principal
from capabilities.conf import abp_settings
from capabilities.protocol.text import unstorable

SUBPROTOCOL = "abp"
BEARER_SUBPROTOCOL = "abp.bearer."
QUERY_PARAMETER = "access_token"


class Refused(Exception):
    """The connection may not be used; `reason` is its stable close reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _headers(scope: Mapping[str, Any]) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def origin_of(scope: Mapping[str, Any]) -> str:
    """The Origin header ('' when the client sent none: not a browser)."""
    return _headers(scope).get(b"origin", b"").decode("latin-1")


def client_address_of(scope: Mapping[str, Any]) -> str:
    """The client's address (behind trusted proxies, the one they forwarded: `with_abp`)."""
    client = scope.get("client") or ("", 0)
    return str(client[0])


def credential_of(scope: Mapping[str, Any]) -> str | None:
    """The credential the client presented, wherever it put it."""
    authorization = _headers(scope).get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for subprotocol in scope.get("subprotocols") or []:
        if subprotocol.startswith(BEARER_SUBPROTOCOL):
            return str(subprotocol[len(BEARER_SUBPROTOCOL) :])
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get(QUERY_PARAMETER)
    return values[0] if values else None


def selected_subprotocol(scope: Mapping[str, Any]) -> str | None:
    """`abp` when the client offered it (browsers require one offered to be selected)."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or []) else None


def key_prefix_presented(scope: Mapping[str, Any]) -> str | None:
    """The key prefix of a presented agent key, before it is checked."""
    presented = credential_of(scope)
    return agent_keys.prefix_of(presented) if presented else None


async def authenticate_async(scope: Mapping[str, Any]) -> Principal:
    """`authenticate`, from the event loop: the database thread only for an agent key.

    Everything else (no credential, a page token, garbage) is decided on the loop, so
    a flood of such connections never queues behind the database thread, nor is a
    refusal late for the handshake's timeout when that thread is busy.
    """
    presented = credential_of(scope)
    if presented and not unstorable(presented) and agent_keys.looks_like_key(presented):
        principal: Principal = await database_sync_to_async(authenticate)(scope)
        return principal
    return authenticate(scope)


def authenticate(scope: Mapping[str, Any]) -> Principal:
    """Who this is; Refused (with its close reason) if they may not connect."""
    address = client_address_of(scope)
    presented = credential_of(scope)
    if presented and unstorable(presented):
        raise Refused("invalid-credentials")
    if not presented:
        if abp_settings().ALLOW_ANONYMOUS:
            return Principal(kind="anonymous", key=None, client_address=address)
        raise Refused("missing-credentials")
    if agent_keys.looks_like_key(presented):
        key = agent_keys.find_key(presented)
        if key is None:
            raise Refused("invalid-credentials")
        if key.is_revoked:
            raise Refused("key-revoked")
        agent_keys.record_use(key)
        return Principal(kind="key", key=key, client_address=address, user_id=key.owner_id)
    if page_tokens.looks_like_page_token(presented):
        try:
            user_id = page_tokens.verify(presented, origin=origin_of(scope))
        except page_tokens.PageTokenError as error:
            raise Refused(error.reason) from error
        return Principal(kind="page", key=None, client_address=address, user_id=user_id)
    raise Refused("invalid-credentials")
