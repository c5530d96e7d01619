"""HTTP views: the ABP manifest, page tokens and the embed bridge.

A host's own pages get `window.abp` from `{% load abp %}{% abp_runtime %}`
(capabilities/templatetags/abp.py), which uses the helpers here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils.cache import patch_cache_control, patch_vary_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.clickjacking import xframe_options_exempt
from django.views.decorators.http import require_GET

from capabilities.access import page_tokens, permissions
from capabilities.access.origins import BadOrigin, normalize_all
from capabilities.calls import availability
from capabilities.calls.app_info import app_info
from capabilities.calls.manifest import capability_entries
from capabilities.conf import abp_settings
from capabilities.protocol import PROTOCOL_VERSION
from capabilities.work import registry

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

# Where agents open their WebSocket (capabilities/transport/routing.py); the pages pass it to
# the browser modules.
WEBSOCKET_PATH = "/abp/ws"


def embed_allowed_origins() -> list[str]:
    """The origins other than the app's own that may embed and drive `/abp/embed/`."""
    try:
        return normalize_all(abp_settings().EMBED_ALLOWED_ORIGINS)
    except BadOrigin as error:
        raise ImproperlyConfigured(f"ABP_EMBED_ALLOWED_ORIGINS: {error}") from error


def page_origin(request: HttpRequest) -> str:
    """The origin this page was served from, as its browser will send it."""
    return request.build_absolute_uri("/").rstrip("/")


def page_token_context(request: HttpRequest) -> dict[str, Any]:
    """What a page needs to open its WebSocket: a fresh token, where to renew it."""
    user = getattr(request, "user", None)
    user_id = user.pk if user is not None and user.is_authenticated else None
    return {
        "token": page_tokens.issue(page_origin(request), user_id=user_id),
        "tokenUrl": reverse("abp-page-token"),
        "tokenMaxAgeSeconds": page_tokens.max_age(),
    }


def manifest_data(user: AbstractBaseUser | None = None) -> dict[str, object]:
    """The manifest: the app and each capability `user` (or anyone) may call, with its
    schemas and availability; where sign-in shows more, it says so."""
    available = availability.for_listing().states()
    entries = capability_entries(available)
    shown = [entry for entry in entries if _may_see(entry["name"], user)]
    data: dict[str, object] = {"abp": PROTOCOL_VERSION, "app": app_info(), "capabilities": shown}
    if user is None and len(shown) < len(entries):
        data["signIn"] = {
            "url": resolve_url(settings.LOGIN_URL),
            "note": "Capabilities that need a user's permission are listed to signed-in "
            "users and to their agents' sessions.",
        }
    return data


def _may_see(name: str, user: AbstractBaseUser | None) -> bool:
    spec = registry.get(name)
    return spec is not None and permissions.user_refusal(spec, user) is None


@require_GET
def manifest(request: HttpRequest) -> JsonResponse:
    """`/abp.json`, readable cross-origin (agents fetch it from anywhere).

    Anyone's: what needs no permission, cached for everyone for a few seconds
    (`available` follows the live workers). A signed-in user's: what they may call,
    cached for them alone.
    """
    user = getattr(request, "user", None)
    signed_in = user if user is not None and user.is_authenticated else None
    response = JsonResponse(manifest_data(signed_in))
    response["Access-Control-Allow-Origin"] = "*"
    if signed_in is None:
        patch_cache_control(response, public=True, max_age=5)
    else:
        patch_cache_control(response, private=True, max_age=5)
    patch_vary_headers(response, ["Cookie"])
    return response


@require_GET
@never_cache
def page_token(request: HttpRequest) -> JsonResponse:
    """`/abp/page-token/`: a fresh page token, for a page open longer than one lasts.

    It grants nothing the pages do not: they are public and carry one too.
    """
    context = page_token_context(request)
    return JsonResponse({"token": context["token"], "maxAgeSeconds": context["tokenMaxAgeSeconds"]})


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
        "maxFrameBytes": abp_settings().MAX_FRAME_BYTES,
        "protocolVersion": PROTOCOL_VERSION,
        "app": app_info(),
        **page_token_context(request),
    }
    response = render(request, "abp/embed.html", {"app": config["app"], "config": config})
    # The site-wide policy (settings.CONTENT_SECURITY_POLICY), framed by the allowed
    # origins instead of nobody, and posting no forms: what django-csp's csp_replace
    # decorator sets, computed per request.
    response._csp_replace = {  # type: ignore[attr-defined]
        "frame-ancestors": ["'self'", *origins],
        "form-action": ["'none'"],
    }
    return response
