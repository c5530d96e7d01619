"""Who a WebSocket connection is, and what it may do in one session."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from capabilities.access import credentials, visibility
from capabilities.access.principal import Principal
from capabilities.calls import start
from capabilities.conf import abp_settings
from capabilities.endings import resumption
from capabilities.session.actions import Limits


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """A connection whose credential checked out."""

    principal: Principal
    visible: frozenset[str] | None
    """The capabilities it is shown (None: all)."""
    limits: Limits
    base_url: str
    """Where it reached us, for download URLs."""


async def admit(scope: dict[str, Any]) -> Admitted:
    """Check the connection's credential; credentials.Refused if it is not let in, or
    the database's error if the credential could not be looked up."""
    principal = await credentials.authenticate_async(scope)
    limits = Limits(
        max_queued_calls=principal.max_queued_calls,
        queue_full_retry_after_ms=abp_settings().QUEUE_FULL_RETRY_AFTER_MS,
        max_timeout_ms=functools.partial(start.max_timeout_ms, principal),
        # Pages resume too (client.js, bridge.js); a page that goes away ends its
        # session itself (pagehide), so only a dropped socket waits out the grace.
        resumable=resumption.grace().total_seconds() > 0,
    )
    return Admitted(
        principal=principal,
        visible=await visibility.names_for_async(principal),
        limits=limits,
        base_url=abp_settings().PUBLIC_BASE_URL or base_url_of(scope),
    )


def base_url_of(scope: dict[str, Any]) -> str:
    """Where this agent reached us (http for ws, https for wss)."""
    host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{'https' if scope.get('scheme') == 'wss' else 'http'}://{host}"
