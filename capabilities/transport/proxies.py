"""The client's address behind trusted proxies (ABP_TRUSTED_PROXIES), for HTTP and WebSocket.

uvicorn's ProxyHeadersMiddleware, around the whole ASGI app: when the TCP peer is a
trusted proxy, the client is the nearest X-Forwarded-For entry from the right that
is not itself a trusted proxy (a client can prepend any entries it likes, never
append after its proxy's), and the scheme is its X-Forwarded-Proto (`wss` for a
WebSocket reached over `https`). Daphne's own `--proxy-headers` believes the first
entry, whoever sent it: it must stay off.
"""

from __future__ import annotations

from typing import Any

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from capabilities.conf import abp_settings


def trusted_proxies() -> list[str]:
    """ABP_TRUSTED_PROXIES: addresses or networks (the settings refuse anything else)."""
    return list(abp_settings().TRUSTED_PROXIES)


def behind_trusted_proxies(application: Any) -> Any:
    """The application, told the client's address by the trusted proxies; as is without any."""
    proxies = trusted_proxies()
    if not proxies:
        return application
    return ProxyHeadersMiddleware(application, trusted_hosts=proxies)
