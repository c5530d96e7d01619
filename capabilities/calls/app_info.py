"""How the service describes itself to agents, whichever door they come in by."""

from __future__ import annotations

from django.conf import settings


def app_info() -> dict[str, str]:
    """The `app` object of initialize-result and the manifest."""
    abp = settings.ABP
    return {
        "id": abp["APP_ID"],
        "name": abp["APP_NAME"],
        "version": abp["APP_VERSION"],
        "description": abp["APP_DESCRIPTION"],
    }
