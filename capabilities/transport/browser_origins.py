"""Which browsers may open the WebSocket: origin checks as ASGI middleware.

An explicit allow-list of full origins (ABP_ALLOWED_ORIGINS), not the ALLOWED_HOSTS
shortcut: a page on another site can never open a socket from a victim's browser.
Who the client is (key, page token) is checked by the consumer (capabilities/access/credentials.py).
"""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator

from capabilities.access.origins import is_allowed, normalize_all
from capabilities.conf import abp_settings


class BrowserOriginValidator(OriginValidator):  # type: ignore[misc]
    """Browsers must come from an allowed origin; clients that send none pass.

    Agents outside a browser send no Origin header (and need an agent key); a
    browser always sends one. A denied upgrade gets HTTP 403.
    """

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return is_allowed(parsed_origin.geturl(), self.allowed_origins)


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    """Wrap the WebSocket app with the ABP_ALLOWED_ORIGINS check."""
    return BrowserOriginValidator(application, normalize_all(abp_settings().ALLOWED_ORIGINS))
