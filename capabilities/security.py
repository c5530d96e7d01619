"""Who may open the WebSocket: origin checks as ASGI middleware, not in consumers."""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings


class BrowserOriginValidator(OriginValidator):  # type: ignore[misc]
    """Browsers must come from an allowed origin; clients that send none pass.

    Agents outside a browser send no Origin header; a browser always does, so a
    page on another site can never drive an agent's session from a victim's browser.
    """

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return bool(super().valid_origin(parsed_origin))


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    """Wrap the WebSocket app; allowed origins are the ALLOWED_HOSTS (any scheme)."""
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed)
