"""Bounds on an open Dynamic Client Registration (RFC 7591), checked before the toolkit's.

MCP clients register anonymously, so anyone may: the body is bounded, and so are the
redirect URIs (how many, how long, and https, or http to a loopback host only, or a
scheme the host allows for a desktop app, such as Cursor's `cursor://`).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

MAX_BODY_BYTES = 16 * 1024
MAX_REDIRECT_URIS = 10
MAX_REDIRECT_URI_LENGTH = 2000
LOOPBACK_NAMES = ("localhost",)


class RegistrationRefused(Exception):
    """The registration breaks a bound; `error` is RFC 7591's code."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error = error
        self.description = description


def check(body: bytes, custom_schemes: tuple[str, ...]) -> None:
    """Refuse a registration body beyond the bounds; RegistrationRefused says why."""
    if len(body) > MAX_BODY_BYTES:
        raise RegistrationRefused(
            "invalid_client_metadata", f"The registration is over {MAX_BODY_BYTES} bytes."
        )
    try:
        metadata: Any = json.loads(body or b"{}")
    except ValueError:
        raise RegistrationRefused("invalid_client_metadata", "The body is not JSON.") from None
    if not isinstance(metadata, dict):
        raise RegistrationRefused("invalid_client_metadata", "The body is not a JSON object.")
    uris = metadata.get("redirect_uris")
    if not isinstance(uris, list) or not uris:
        raise RegistrationRefused("invalid_redirect_uri", "redirect_uris must be a non-empty list.")
    if len(uris) > MAX_REDIRECT_URIS:
        raise RegistrationRefused(
            "invalid_redirect_uri", f"At most {MAX_REDIRECT_URIS} redirect_uris may be registered."
        )
    for uri in uris:
        _check_uri(uri, custom_schemes)


def _check_uri(uri: Any, custom_schemes: tuple[str, ...]) -> None:
    if not isinstance(uri, str) or len(uri) > MAX_REDIRECT_URI_LENGTH:
        raise RegistrationRefused(
            "invalid_redirect_uri",
            f"Each redirect URI is a string of at most {MAX_REDIRECT_URI_LENGTH} characters.",
        )
    parts = urlsplit(uri)
    if parts.fragment:
        raise RegistrationRefused("invalid_redirect_uri", f"{uri!r} has a fragment.")
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and is_loopback(parts.hostname or ""):
        return
    if parts.scheme in custom_schemes:
        return
    raise RegistrationRefused(
        "invalid_redirect_uri",
        f"{uri!r}: a redirect URI is https, or http to a loopback address "
        "(127.0.0.1, [::1], localhost).",
    )


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redirect_host(uri: str) -> str:
    """The host a redirect URI sends the user back to, as the consent page shows it."""
    parts = urlsplit(uri)
    return (parts.hostname or f"{parts.scheme}:") if uri else ""


def redirect_origin(uri: str) -> str:
    """A redirect URI's origin as a CSP source: `https://host:port`, or `scheme:`."""
    parts = urlsplit(uri)
    if not uri:
        return ""
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else f"{parts.scheme}:"
