"""Who opened a WebSocket: an agent key, a page token, or (development) nobody.

The credential comes, in this order, from `Authorization: Bearer <credential>`, a
subprotocol `abp.bearer.<credential>` (browsers cannot set headers; they offer
`["abp", "abp.bearer.<credential>"]` and we select `abp`), or the query parameter
`access_token` (for clients that can do neither; it ends up in access logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

from django.conf import settings

from capabilities import agent_keys, page_tokens
from capabilities.models import AgentKey
from capabilities.protocol.text import unstorable

SUBPROTOCOL = "abp"
BEARER_SUBPROTOCOL = "abp.bearer."
QUERY_PARAMETER = "access_token"

# WebSocket close code of each refusal (4000-4999 are the application's). Daphne
# sends no close reason, so a `notifications/error` frame before the close names it.
CLOSE_CODES = {
    "missing-credentials": 4401,
    "invalid-credentials": 4401,
    "key-revoked": 4403,
    "expired-credentials": 4419,
}
# Closed after an initialize refused for too many open sessions (RATE_LIMITED).
TOO_MANY_SESSIONS_CLOSE_CODE = 4429
REFUSAL_MESSAGES = {
    "missing-credentials": "An agent key is required (Authorization: Bearer, a subprotocol "
    "abp.bearer.<key>, or ?access_token=).",
    "invalid-credentials": "The agent key or page token is not valid.",
    "key-revoked": "The agent key was revoked.",
    "expired-credentials": "The page token expired; reload the page (or fetch a new one).",
}


class Refused(Exception):
    """The connection may not be used; `reason` is its stable close reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who is on the other end, and the limits that apply to them.

    Page tokens go to anyone who loads a page, so their budget is the smallest.
    """

    kind: Literal["key", "page", "anonymous"]
    key: AgentKey | None
    client_address: str

    @property
    def rate_limit_id(self) -> str:
        """Whose budgets this connection spends: calls per minute, calls in flight, sessions."""
        if self.key is not None:
            return f"key:{self.key.prefix}"
        # Page tokens are free to anyone who loads a page: budget per address.
        return f"{self.kind}:{self.client_address}"

    @property
    def max_concurrent_calls(self) -> int:
        """Calls in flight at once in one session."""
        own = self.key.max_concurrent_calls if self.key is not None else None
        limit = int(own if own is not None else settings.ABP["MAX_CONCURRENT_CALLS"])
        return min(limit, self.max_calls_in_flight)

    @property
    def max_calls_in_flight(self) -> int:
        """Calls in flight at once across all of this principal's sessions."""
        if self.kind == "page":
            return int(settings.ABP["PAGE_TOKEN_MAX_CONCURRENT_CALLS"])
        return int(settings.ABP["MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL"])

    @property
    def max_open_sessions(self) -> int:
        """Sessions open at once (held or resumable) for this principal."""
        return int(settings.ABP["MAX_OPEN_SESSIONS_PER_PRINCIPAL"])

    @property
    def calls_per_minute(self) -> int:
        """Calls per minute in this principal's budget."""
        if self.kind == "page":
            return int(settings.ABP["PAGE_TOKEN_CALLS_PER_MINUTE"])
        own = self.key.calls_per_minute if self.key is not None else None
        return int(own if own is not None else settings.ABP["CALLS_PER_MINUTE"])

    @property
    def max_params_bytes(self) -> int | None:
        """The largest call (its params as JSON), or None for no limit beyond the frame's."""
        return int(settings.ABP["PAGE_TOKEN_MAX_PARAMS_BYTES"]) if self.kind == "page" else None

    def max_timeout_ms(self, capability_max_ms: int) -> int:
        """The longest options.timeout, given the capability's own maximum."""
        if self.kind == "page":
            return min(capability_max_ms, int(settings.ABP["PAGE_TOKEN_MAX_TIMEOUT_MS"]))
        return capability_max_ms

    def may_call(self, capability: str) -> bool:
        """Whether this principal may call the capability at all."""
        allowed: list[str] = settings.ABP["PAGE_TOKEN_CAPABILITIES"]
        return self.kind != "page" or not allowed or capability in allowed


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def origin_of(scope: dict[str, Any]) -> str:
    """The Origin header ('' when the client sent none: not a browser)."""
    return _headers(scope).get(b"origin", b"").decode("latin-1")


def client_address_of(scope: dict[str, Any]) -> str:
    """The client's address (behind trusted proxies, the one they forwarded: abpsite/asgi.py)."""
    client = scope.get("client") or ("", 0)
    return str(client[0])


def credential_of(scope: dict[str, Any]) -> str | None:
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


def selected_subprotocol(scope: dict[str, Any]) -> str | None:
    """`abp` when the client offered it (browsers require one offered to be selected)."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or []) else None


def key_prefix_presented(scope: dict[str, Any]) -> str | None:
    """The key prefix of a presented agent key, before it is checked."""
    presented = credential_of(scope)
    return agent_keys.prefix_of(presented) if presented else None


def authenticate(scope: dict[str, Any]) -> Principal:
    """Who this is; Refused (with its close reason) if they may not connect."""
    address = client_address_of(scope)
    presented = credential_of(scope)
    if presented and unstorable(presented):
        raise Refused("invalid-credentials")
    if not presented:
        if settings.ABP["ALLOW_ANONYMOUS"]:
            return Principal(kind="anonymous", key=None, client_address=address)
        raise Refused("missing-credentials")
    if agent_keys.looks_like_key(presented):
        key = agent_keys.find_key(presented)
        if key is None:
            raise Refused("invalid-credentials")
        if key.is_revoked:
            raise Refused("key-revoked")
        agent_keys.record_use(key)
        return Principal(kind="key", key=key, client_address=address)
    if page_tokens.looks_like_page_token(presented):
        try:
            page_tokens.verify(presented, origin=origin_of(scope))
        except page_tokens.PageTokenError as error:
            raise Refused(error.reason) from error
        return Principal(kind="page", key=None, client_address=address)
    raise Refused("invalid-credentials")
