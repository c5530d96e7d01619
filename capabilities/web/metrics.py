"""`/metrics` for Prometheus: the cluster's metrics, behind a token and/or an address list.

Off (404) unless ABP_METRICS_TOKEN or ABP_METRICS_ALLOWED_IPS is set (development
allows loopback). With addresses, the client's (REMOTE_ADDR, as resolved through
ABP_TRUSTED_PROXIES) must be in one of them (else 403); with a token, the request must
carry `Authorization: Bearer <token>` (else 401); with both, both. What is measured:
metrics_collector.py and docs/operating.md#health-and-metrics.

A scrape runs in a thread of its own, one scrape at a time per process (a second one
waits for the first), never in the thread Channels and Django share for the database.
OpenMetrics is answered to scrapers that ask for it (Prometheus does), the classic text
format otherwise.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from capabilities.conf import metrics_settings
from capabilities.web import cluster_state
from capabilities.web.metrics_collector import ClusterCollector

# The longest one scrape may take before it is answered 503 (a scraper's own timeout is
# usually 10 s).
SCRAPE_TIMEOUT_SECONDS = 8.0

REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(ClusterCollector())

_scrapes = cluster_state.Probe("abp-metrics", threads=1)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@require_safe
async def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics, to an allowed scraper."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        body = await _scrapes.run(_render(encoder), SCRAPE_TIMEOUT_SECONDS)
    except TimeoutError:
        return _no_store(
            HttpResponse("The scrape timed out.\n", status=503, content_type="text/plain")
        )
    return _no_store(HttpResponse(body, content_type=content_type))


def _render(encoder: Callable[[CollectorRegistry], bytes]) -> Callable[[], bytes]:
    return lambda: encoder(REGISTRY)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics (404, 403, 401), or None."""
    token: str = metrics_settings().TOKEN
    networks = _networks(metrics_settings().ALLOWED_IPS)
    if not token and not networks:
        return _no_store(HttpResponse("Not Found\n", status=404, content_type="text/plain"))
    if networks and not _allowed(request.META.get("REMOTE_ADDR", ""), networks):
        return _no_store(HttpResponse("Forbidden\n", status=403, content_type="text/plain"))
    if token and not _bearer_matches(request.headers.get("Authorization", ""), token):
        response = HttpResponse("Unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return _no_store(response)
    return None


@functools.cache
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _allowed(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


def _bearer_matches(header: str, token: str) -> bool:
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response
