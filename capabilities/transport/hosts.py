"""Which Host a WebSocket upgrade may name: ALLOWED_HOSTS, as on the HTTP side.

Django checks the Host of every HTTP request (`HttpRequest.get_host`); Channels does
not for a WebSocket. Download URLs are built from it (transport/admission.py's `base_url_of`), so
an upgrade naming another host is refused before it reaches the consumer: HTTP 403,
as the origin check refuses (capabilities/transport/browser_origins.py).
"""

from __future__ import annotations

from typing import Any

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

# What HttpRequest.get_host allows under DEBUG when ALLOWED_HOSTS is empty.
_DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS, read now; under DEBUG with none set, localhost's, as Django does."""
    hosts = list(settings.ALLOWED_HOSTS)
    return _DEBUG_HOSTS if settings.DEBUG and not hosts else hosts


def hosts_of(scope: dict[str, Any]) -> list[str]:
    """Every Host header; none sent: the server's own address, as Django's SERVER_NAME."""
    hosts = [value.decode("latin-1") for name, value in scope.get("headers", []) if name == b"host"]
    if hosts:
        return hosts
    server = scope.get("server")
    return [str(server[0])] if server else [""]


def is_allowed_host(host: str, allowed: list[str]) -> bool:
    """Whether a Host header (with or without its port) names an allowed host."""
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


class AllowedHostsValidator:
    """Refuse a WebSocket upgrade whose Host is not in ALLOWED_HOSTS (HTTP 403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        allowed = allowed_hosts()
        if all(is_allowed_host(host, allowed) for host in hosts_of(scope)):
            await self.application(scope, receive, send)
        else:
            await WebsocketDenier()(scope, receive, send)
