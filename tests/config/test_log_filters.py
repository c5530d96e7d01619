"""The one Celery warning the app drops, and only that one, in any host."""

from __future__ import annotations

import logging

from capabilities.log_filters import CONTROL_LOGGER, RevokeWithoutResultBackend, install


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(CONTROL_LOGGER, logging.WARNING, "", 0, message, args, None)


def test_the_revoke_warning_without_a_backend_is_dropped_and_others_kept() -> None:
    keep = RevokeWithoutResultBackend().filter
    template = "Failed to mark task %s as revoked in backend: %s"
    assert not keep(record(template, "abc", "No result backend is configured."))
    assert keep(record(template, "abc", "Connection refused"))
    assert keep(record("Terminating %s (%s)", "abc", "SIGKILL"))


def test_the_app_installs_it_on_celerys_control_logger_once_without_any_setting() -> None:
    """Installed by the app at start (the demo's LOGGING names no filter)."""
    from django.conf import settings

    assert "filters" not in settings.LOGGING
    logger = logging.getLogger(CONTROL_LOGGER)
    installed = [f for f in logger.filters if isinstance(f, RevokeWithoutResultBackend)]
    assert len(installed) == 1
    install()
    assert [f for f in logger.filters if isinstance(f, RevokeWithoutResultBackend)] == installed
