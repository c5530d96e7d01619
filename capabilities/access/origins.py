"""Browser origins: parsing allow-list entries and matching an Origin header against them.

Pure (no Django models): settings validate their lists with it at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# scheme://host[:port], where the port may be `*` (any port), as CSP's frame-ancestors
# writes it. Browsers send origins without a path and without the default port.
_ORIGIN = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(?P<port>\d{1,5}|\*))?/?$",
    re.IGNORECASE,
)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class BadOrigin(ValueError):
    """An allow-list entry that is not a full origin."""


def normalize_origin(value: str) -> str:
    """An origin (or allow-list pattern) as browsers write origins; BadOrigin if not one."""
    match = _ORIGIN.match(value.strip())
    if match is None:
        raise BadOrigin(
            f"{value!r} is not an origin (scheme://host[:port], with `*` for any port; "
            "never `*` alone or `null`)."
        )
    scheme, host, port = match["scheme"].lower(), match["host"].lower(), match["port"]
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def normalize_all(values: Iterable[str]) -> list[str]:
    """Each entry normalized, duplicates dropped, order kept."""
    origins: list[str] = []
    for value in values:
        origin = normalize_origin(value)
        if origin not in origins:
            origins.append(origin)
    return origins


def is_allowed(origin: str, patterns: list[str]) -> bool:
    """Whether a browser's Origin header matches one of the (normalized) patterns."""
    try:
        origin = normalize_origin(origin)
    except BadOrigin:
        return False  # `null` (sandboxed frames, file:) and anything malformed
    if origin.endswith(":*"):
        return False  # a pattern, not an origin
    for pattern in patterns:
        if origin == pattern:
            return True
        if pattern.endswith(":*"):
            base = pattern[:-2]
            # Any port, the default one (left out of the origin) included.
            if origin == base or (
                origin.startswith(base + ":") and origin[len(base) + 1 :].isdigit()
            ):
                return True
    return False
