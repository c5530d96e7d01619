"""The one Celery warning we drop, and only that one."""

from __future__ import annotations

import logging
from typing import Any

from abpsite.log_filters import RevokeWithoutResultBackend


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("celery.worker.control", logging.WARNING, "", 0, message, args, None)


def test_the_revoke_warning_without_a_backend_is_dropped_and_others_kept() -> None:
    keep = RevokeWithoutResultBackend().filter
    template = "Failed to mark task %s as revoked in backend: %s"
    assert not keep(record(template, "abc", "No result backend is configured."))
    assert keep(record(template, "abc", "Connection refused"))
    assert keep(record("Terminating %s (%s)", "abc", "SIGKILL"))


def test_settings_attach_it_to_celerys_control_logger() -> None:
    from django.conf import settings

    loggers: dict[str, Any] = settings.LOGGING["loggers"]
    assert loggers["celery.worker.control"]["filters"] == ["revoke_without_backend"]
