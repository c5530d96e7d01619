"""HTTP views: the app page and the ABP manifest."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from capabilities import registry
from capabilities.consumers import app_info
from capabilities.protocol import PROTOCOL_VERSION


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


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The app page, with the manifest link in its server-rendered head."""
    return render(request, "index.html", {"app": app_info(), "specs": registry.all_specs()})
