"""Answer the orchestrator's probes before host validation and the HTTPS redirect.

Docker, Kubernetes and load balancers probe `/healthz` and `/readyz` over plain HTTP
at the container's own address, which is in neither ALLOWED_HOSTS nor behind TLS:
Django would answer them 400 or 301. Both answer nothing secret, so they are served
first in the middleware chain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

from capabilities.web import health

PROBES = {"/healthz": health.healthz, "/readyz": health.readyz}

Handler = Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]


@sync_and_async_middleware
def probes_first(get_response: Handler) -> Handler:
    """Middleware: the probe views for their two paths, the rest of the chain otherwise."""
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            probe = PROBES.get(request.path_info)
            if probe is not None:
                return await probe(request)
            return cast("HttpResponseBase", await get_response(request))

        return middleware

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        probe = PROBES.get(request.path_info)
        if probe is not None:
            return async_to_sync(probe)(request)
        return get_response(request)  # type: ignore[return-value]

    return sync_middleware
