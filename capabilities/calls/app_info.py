"""How the service describes itself to agents, whichever door they come in by."""

from __future__ import annotations

from capabilities.conf import abp_settings


def app_info() -> dict[str, str]:
    """The `app` object of initialize-result and the manifest."""
    abp = abp_settings()
    return {
        "id": abp.APP_ID,
        "name": abp.APP_NAME,
        "version": abp.APP_VERSION,
        "description": abp.APP_DESCRIPTION,
    }
