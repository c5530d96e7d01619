"""The demo project's own page, `/`: it gets `window.abp` from abp/base.html.

The demo's forms are the app's console (`/abp/console/`, capabilities/web/console.py).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from capabilities.calls.app_info import app_info
from capabilities.web.views import WEBSOCKET_PATH
from capabilities.work import registry


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The home page: what the app offers, to agents and to people."""
    context = {"app": app_info(), "websocket_path": WEBSOCKET_PATH, "specs": registry.all_specs()}
    return render(request, "abpsite/home.html", context)
