"""HTTP views: the app page, the ABP manifest, the embed bridge, the demo, and the
browser modules (`static/abp/`, served by WhiteNoise) that those pages load."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.clickjacking import xframe_options_exempt
from django.views.decorators.http import require_GET

from capabilities import registry
from capabilities.consumers import app_info
from capabilities.protocol import PROTOCOL_VERSION

# Where agents open their WebSocket (capabilities/routing.py); the pages pass it to
# the browser modules.
WEBSOCKET_PATH = "/abp/ws"

# scheme://host[:port], where the port may be `*` (any port), as CSP's frame-ancestors
# writes it. Browsers send origins without a path and without the default port.
_ORIGIN = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(?P<port>\d{1,5}|\*))?/?$",
    re.IGNORECASE,
)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def normalize_origin(value: str) -> str:
    """An allowed-origin entry as browsers write origins; ImproperlyConfigured if it is not one."""
    match = _ORIGIN.match(value.strip())
    if match is None:
        raise ImproperlyConfigured(
            f"ABP_EMBED_ALLOWED_ORIGINS: {value!r} is not an origin "
            "(scheme://host[:port], with `*` for any port; never `*` alone or `null`)."
        )
    scheme, host, port = match["scheme"].lower(), match["host"].lower(), match["port"]
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def embed_allowed_origins() -> list[str]:
    """The origins other than the app's own that may embed and drive `/abp/embed/`."""
    origins: list[str] = []
    for entry in settings.ABP["EMBED_ALLOWED_ORIGINS"]:
        origin = normalize_origin(entry)
        if origin not in origins:
            origins.append(origin)
    return origins


def _embed_csp(origins: list[str]) -> str:
    """The embed page's policy: its own scripts only, and framed only by allowed origins."""
    connect = ["'self'"]
    public = settings.ABP["PUBLIC_BASE_URL"]
    if public:
        # Download URLs point there; the bridge fetches them for ArrayBuffer results.
        parts = urlsplit(public)
        connect.append(f"{parts.scheme}://{parts.netloc}")
    ancestors = ["'self'", *origins]
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            f"connect-src {' '.join(connect)}",
            "base-uri 'none'",
            "form-action 'none'",
            f"frame-ancestors {' '.join(ancestors)}",
        ]
    )


def manifest_data() -> dict[str, object]:
    """The manifest: the app and every capability with its schemas."""
    return {
        "abp": PROTOCOL_VERSION,
        "app": app_info(),
        "capabilities": [spec.describe() for spec in registry.all_specs()],
    }


@require_GET
@cache_control(public=True, max_age=300)
def manifest(request: HttpRequest) -> JsonResponse:
    """`/abp.json`, readable cross-origin (agents fetch it from anywhere)."""
    response = JsonResponse(manifest_data())
    response["Access-Control-Allow-Origin"] = "*"
    return response


def _page_context(**extra: Any) -> dict[str, Any]:
    return {"app": app_info(), "websocket_path": WEBSOCKET_PATH, **extra}


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The app page: the manifest link and the `window.abp` runtime in its head."""
    return render(request, "index.html", _page_context(specs=registry.all_specs()))


@require_GET
def demo(request: HttpRequest) -> HttpResponse:
    """A page for people: it embeds the bridge and runs jobs through it with client.js."""
    return render(request, "abp/demo.html", _page_context())


@require_GET
@xframe_options_exempt
def embed(request: HttpRequest) -> HttpResponse:
    """`/abp/embed/`: the postMessage bridge other sites embed in an iframe.

    XFrameOptionsMiddleware would send DENY; this page is made to be framed, but only
    by the allowed origins, which its CSP's frame-ancestors names (the bridge script
    checks every message's origin against the same list).
    """
    origins = embed_allowed_origins()
    config = {
        "endpoint": WEBSOCKET_PATH,
        "allowedOrigins": origins,
        "maxFrameBytes": settings.ABP["MAX_FRAME_BYTES"],
        "protocolVersion": PROTOCOL_VERSION,
        "app": app_info(),
    }
    response = render(request, "abp/embed.html", _page_context(config=config))
    response["Content-Security-Policy"] = _embed_csp(origins)
    return response
