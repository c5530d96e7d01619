"""Who is on the other end of a call, and the limits that apply to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from capabilities.conf import abp_settings
from capabilities.models import AgentKey
from capabilities.work import registry


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who is on the other end, the user they act for, and the limits that apply.

    Page tokens go to anyone who loads a page, so their budget is the smallest. The
    user (`user_id`) is an agent key's owner, the user who granted an OAuth access
    token, or the signed-in user a page was served to; None for a service key (no
    owner), an anonymous page, or development mode.
    """

    kind: Literal["key", "token", "page", "anonymous"]
    key: AgentKey | None
    client_address: str
    user_id: int | None = None
    # An OAuth access token's client (its client_id) and scopes.
    oauth_client: str = ""
    scopes: tuple[str, ...] = ()

    @property
    def client(self) -> str:
        """What made the call for the user: the agent key's prefix, or the OAuth
        client's id ("" for a page)."""
        return self.key.prefix if self.key is not None else self.oauth_client

    @property
    def rate_limit_id(self) -> str:
        """Whose budgets this connection spends: calls per minute, calls in flight, sessions.

        A user's keys share one budget: a hundred keys buy no more than one.
        """
        if self.kind in ("key", "token") and self.user_id is not None:
            return f"user:{self.user_id}"
        if self.key is not None:
            return f"key:{self.key.prefix}"
        # Page tokens are free to anyone who loads a page: budget per address.
        return f"{self.kind}:{self.client_address}"

    @property
    def max_concurrent_calls(self) -> int:
        """Jobs running at once: this principal's share of the workers."""
        return self._limit("max_concurrent_calls", abp_settings().MAX_CONCURRENT_CALLS)

    @property
    def max_queued_calls(self) -> int:
        """Calls queued or running at once in one session."""
        return self._limit("max_queued_calls", abp_settings().MAX_QUEUED_CALLS)

    @property
    def max_calls_in_flight(self) -> int:
        """Calls queued or running at once across all of this principal's sessions."""
        # A key allowed a longer queue per session may fill it.
        own = self.key.max_queued_calls if self.key is not None else None
        setting = self._limit(None, abp_settings().MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL)
        return setting if self.kind == "page" else max(setting, own or 0)

    def _limit(self, key_field: str | None, setting: int) -> int:
        """The key's own value of a limit, else the setting's; a page token's is its own."""
        if self.kind == "page":
            return abp_settings().PAGE_TOKEN_MAX_CONCURRENT_CALLS
        own = getattr(self.key, key_field) if key_field and self.key is not None else None
        return int(own) if own is not None else setting

    @property
    def max_open_sessions(self) -> int:
        """Sessions open at once (held or resumable) for this principal.

        A key's own bound, else the setting (a client address's, for anonymous
        clients); page tokens get their own, per client address.
        """
        if self.kind == "page":
            return abp_settings().PAGE_TOKEN_MAX_OPEN_SESSIONS
        own = self.key.max_open_sessions if self.key is not None else None
        return int(own if own is not None else abp_settings().MAX_OPEN_SESSIONS_PER_PRINCIPAL)

    @property
    def calls_per_minute(self) -> int:
        """Calls per minute in this principal's budget."""
        if self.kind == "page":
            return abp_settings().PAGE_TOKEN_CALLS_PER_MINUTE
        own = self.key.calls_per_minute if self.key is not None else None
        return int(own if own is not None else abp_settings().CALLS_PER_MINUTE)

    @property
    def max_params_bytes(self) -> int | None:
        """The largest call (its params as JSON), or None for no limit beyond the frame's."""
        return abp_settings().PAGE_TOKEN_MAX_PARAMS_BYTES if self.kind == "page" else None

    def max_timeout_ms(self, capability_max_ms: int) -> int:
        """The longest options.timeout, given the capability's own maximum."""
        if self.kind == "page":
            return min(capability_max_ms, abp_settings().PAGE_TOKEN_MAX_TIMEOUT_MS)
        return capability_max_ms

    def missing_scopes(self, capability: str) -> tuple[str, ...]:
        """The OAuth scopes the capability needs that this token lacks (none for others)."""
        spec = registry.get(capability) if self.kind == "token" else None
        return tuple(scope for scope in spec.scopes if scope not in self.scopes) if spec else ()

    def may_call(self, capability: str) -> bool:
        """Whether this principal may call the capability at all (no I/O).

        A key with scopes, only those; an access token, those whose OAuth scopes it
        carries; an anonymous page, only the page-token list. Django permissions are
        checked later, with the user (access/permissions.py).
        """
        if self.key is not None and self.key.scopes:
            return capability in self.key.scopes
        if self.kind == "token":
            return not self.missing_scopes(capability)
        if self.kind != "page" or self.user_id is not None:
            return True
        allowed = abp_settings().PAGE_TOKEN_CAPABILITIES
        return not allowed or capability in allowed
