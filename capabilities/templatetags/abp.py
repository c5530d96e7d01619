"""`{% load abp %}`: `{% abp_runtime %}` puts `window.abp` on a host's own pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.core.exceptions import ImproperlyConfigured

from capabilities.calls.app_info import app_info
from capabilities.web.views import WEBSOCKET_PATH, page_token_context

register = template.Library()


@register.inclusion_tag("abp/runtime.html", takes_context=True)
def abp_runtime(context: template.Context) -> dict[str, Any]:
    """The runtime's script tag and the manifest link: first in `<head>`, before any script.

    The page token is bound to the origin the page is served from, so it needs the request.
    """
    request = context.get("request")
    if request is None:
        raise ImproperlyConfigured(
            "{% abp_runtime %} needs the request in the template context: add "
            "'django.template.context_processors.request' to TEMPLATES' "
            "'context_processors', and render with render(request, ...)."
        )
    return {
        "websocket_path": WEBSOCKET_PATH,
        "page_token": page_token_context(request),
        "app": app_info(),
    }
