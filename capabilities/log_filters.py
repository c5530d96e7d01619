"""The one Celery warning the app drops, in every host: installed by the app at start.

The host's own LOGGING may still name `celery.worker.control`; its filters then win.
"""

from __future__ import annotations

import logging


class RevokeWithoutResultBackend(logging.Filter):
    """Drop Celery's warning that a revoke could not be stored in a result backend.

    Celery 5.7 tries to mark every revoked task in the result backend and warns,
    once per cancel, when there is none. There is none on purpose: the job row is
    the record of every outcome. Any other failure to mark a task still shows.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Failed to mark task")
            and "No result backend is configured" in message
        )


# Celery logs the warning from its remote-control handler, in the worker's main process.
CONTROL_LOGGER = "celery.worker.control"


def install() -> None:
    """Attach the filter to Celery's control logger, once (AppConfig.ready)."""
    logger = logging.getLogger(CONTROL_LOGGER)
    if not any(isinstance(existing, RevokeWithoutResultBackend) for existing in logger.filters):
        logger.addFilter(RevokeWithoutResultBackend())
