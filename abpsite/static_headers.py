"""Extra headers on static files served by WhiteNoise."""

from __future__ import annotations

from typing import Any


def add_headers(headers: Any, path: str, url: str) -> None:
    """The ABP browser modules are revalidated on every use, so a deploy is seen at once.

    (WhiteNoise already lets any origin read them: a parent page on another site
    imports client.js as a module, fetched with CORS.)
    """
    if url.startswith(("/static/abp/", "/static/abpsite/")):
        headers["Cache-Control"] = "no-cache"
