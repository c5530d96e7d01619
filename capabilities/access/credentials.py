"""Who opened a connection: an agent key, an access token, a page token, or nobody.

An agent key acts for its owner, an OAuth access token for the user who granted it
(access/oauth_tokens.py), a page token for the user the page was served to
(access/principal.py); a session cookie alone authenticates nothing here. Nobody is
allowed only in development (ABP["ALLOW_ANONYMOUS"]).

The credential comes, in this order, from `Authorization: Bearer <credential>`, a
subprotocol `abp.bearer.<credential>` (browsers cannot set headers; they offer
`["abp", "abp.bearer.<credential>"]` and we select `abp`), or the query parameter
`access_token` (for WebSocket clients that can do neither; it ends up in access
logs, and /mcp refuses it, as MCP requires).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from capabilities.access import agent_keys, oauth_tokens, page_tokens
from capabilities.access.principal import Principal
from capabilities.conf import abp_settings
from capabilities.protocol.text import unstorable
from capabilities.work.users import load_user

SUBPROTOCOL = "abp"
BEARER_SUBPROTOCOL = "abp.bearer."
QUERY_PARAMETER = "access_token"
# Credentials of ours start so (`abp_` keys); an access token never does.
OWN_PREFIX = "abp"


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


def credential_of(scope: Mapping[str, Any], *, query: bool = True) -> str | None:
    """The credential the client presented, wherever it put it (`query`: or the URL)."""
    authorization = _headers(scope).get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for subprotocol in scope.get("subprotocols") or []:
        if subprotocol.startswith(BEARER_SUBPROTOCOL):
            return str(subprotocol[len(BEARER_SUBPROTOCOL) :])
    return query_credential(scope) if query else None


def query_credential(scope: Mapping[str, Any]) -> str | None:
    """A credential in the query string (`?access_token=`), if any."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(QUERY_PARAMETER)
    return values[0] if values else None


def resource_url(scope: Mapping[str, Any]) -> str:
    """The URL the connection was made to, as an access token's audience must cover it.

    http(s) for WebSockets too: a token names the server's resource, not the scheme
    of one door. Behind a proxy, the Host it forwarded (`with_abp`).
    """
    scheme = str(scope.get("scheme") or "http")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    host = _headers(scope).get(b"host", b"").decode("latin-1")
    return f"{scheme}://{host}{scope.get('path', '')}"


def selected_subprotocol(scope: Mapping[str, Any]) -> str | None:
    """`abp` when the client offered it (browsers require one offered to be selected)."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or []) else None


def key_prefix_presented(scope: Mapping[str, Any]) -> str | None:
    """The key prefix of a presented agent key, before it is checked."""
    presented = credential_of(scope)
    return agent_keys.prefix_of(presented) if presented else None


async def authenticate_async(scope: Mapping[str, Any], *, query: bool = True) -> Principal:
    """`authenticate`, from the event loop: the database thread only for a key or token.

    Everything else (no credential, a page token, garbage) is decided on the loop, so
    a flood of such connections never queues behind the database thread, nor is a
    refusal late for the handshake's timeout when that thread is busy.
    """
    presented = credential_of(scope, query=query)
    if presented and not unstorable(presented) and _looked_up(presented):
        principal: Principal = await database_sync_to_async(authenticate)(scope, query=query)
        return principal
    return authenticate(scope, query=query)


def _looked_up(presented: str) -> bool:
    """Whether checking this credential needs the database: a key, or an access token.

    What could be neither (our own prefixes, or not RFC 6750's token syntax) is refused
    on the loop; an opaque access token can only be told from garbage by a lookup.
    """
    if agent_keys.looks_like_key(presented):
        return True
    if page_tokens.looks_like_page_token(presented):
        # A signed-in user's page: whether that user is still active.
        return page_tokens.names_a_user(presented)
    return _could_be_token(presented)


def _could_be_token(presented: str) -> bool:
    return (
        oauth_tokens.enabled()
        and not presented.startswith(OWN_PREFIX)
        and oauth_tokens.well_formed(presented)
    )


def authenticate(scope: Mapping[str, Any], *, query: bool = True) -> Principal:
    """Who this is; Refused (with its close reason) if they may not connect.

    `query`: whether a credential in the URL counts (never at /mcp).
    """
    address = client_address_of(scope)
    presented = credential_of(scope, query=query)
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
        if key.owner is not None and not key.owner.is_active:
            raise Refused("user-inactive")
        agent_keys.record_use(key)
        return Principal(kind="key", key=key, client_address=address, user_id=key.owner_id)
    if page_tokens.looks_like_page_token(presented):
        try:
            user_id = page_tokens.verify(presented, origin=origin_of(scope))
        except page_tokens.PageTokenError as error:
            raise Refused(error.reason) from error
        if user_id is not None and load_user(user_id) is None:
            raise Refused("user-inactive")
        return Principal(kind="page", key=None, client_address=address, user_id=user_id)
    if _could_be_token(presented):
        return _token_principal(presented, scope, address)
    raise Refused("invalid-credentials")


def _token_principal(presented: str, scope: Mapping[str, Any], address: str) -> Principal:
    """The principal of an OAuth access token, which must carry the `jobs` scope."""
    try:
        grant = oauth_tokens.verify(presented, oauth_tokens.public_url(resource_url(scope)))
    except oauth_tokens.TokenRefused as refused:
        raise Refused(refused.reason) from refused
    if oauth_tokens.JOBS_SCOPE not in grant.scopes:
        raise Refused("insufficient-scope")
    return Principal(
        kind="token",
        key=None,
        client_address=address,
        user_id=grant.user_id,
        oauth_client=grant.client_id,
        scopes=grant.scopes,
    )
