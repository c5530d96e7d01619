"""The client's address behind trusted proxies (ABP_TRUSTED_PROXIES), for HTTP and WebSocket.

uvicorn's ProxyHeadersMiddleware, around the whole ASGI app: when the TCP peer is a
trusted proxy, the client is the nearest X-Forwarded-For entry from the right that
is not itself a trusted proxy (a client can prepend any entries it likes, never
append after its proxy's), and the scheme is its X-Forwarded-Proto (`wss` for a
WebSocket reached over `https`). Daphne's own `--proxy-headers` believes the first
entry, whoever sent it: it must stay off.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware


def trusted_proxies() -> list[str]:
    """ABP_TRUSTED_PROXIES, each entry an address or a network; ImproperlyConfigured if not."""
    entries: list[str] = settings.ABP["TRUSTED_PROXIES"]
    for entry in entries:
        try:
            if "/" in entry:
                ipaddress.ip_network(entry)
            else:
                ipaddress.ip_address(entry)
        except ValueError as error:
            # uvicorn would take `*` as "trust everyone" (the first entry again) and
            # anything else it cannot parse as a name no peer ever has.
            raise ImproperlyConfigured(
                f"ABP_TRUSTED_PROXIES: {entry!r} is not an IP address or network ({error})."
            ) from error
    return entries


def behind_trusted_proxies(application: Any) -> Any:
    """The application, told the client's address by the trusted proxies; as is without any."""
    proxies = trusted_proxies()
    if not proxies:
        return application
    return ProxyHeadersMiddleware(application, trusted_hosts=proxies)
