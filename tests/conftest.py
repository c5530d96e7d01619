"""Test configuration: one private environment for the whole run.

Before Django loads, the environment points at a temporary SQLite file, a Redis
on a free port and a temporary media root; the processes of the integration
stack (tests/support/stack.py) inherit it, so the test process sees the same DB.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stack import Stack, free_port

RUN_DIR = Path(tempfile.mkdtemp(prefix="abp-test-"))
REDIS_PORT = free_port()

os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-production",
        "DJANGO_DEBUG": "0",
        "DATABASE_URL": f"sqlite:///{RUN_DIR / 'db.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
        "DJANGO_MEDIA_ROOT": str(RUN_DIR / "media"),
        "DJANGO_LOG_LEVEL": "INFO",
        "ABP_REAPER_INTERVAL_SECONDS": "0.5",
        "ABP_HARD_KILL_GRACE_SECONDS": "1.5",
    }
)

import django  # noqa: E402 - after the environment is set

django.setup()

from django.core.management import call_command  # noqa: E402

call_command("migrate", verbosity=0)

ARTIFACTS = Path(os.environ.get("ABP_TEST_ARTIFACTS", Path(__file__).parent.parent / "var" / "test-artifacts"))


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The real stack: Redis, Celery worker and beat, Daphne."""
    running = Stack(RUN_DIR, REDIS_PORT)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        _keep_logs(running)


def _keep_logs(running: Stack) -> None:
    # Logs of the processes are kept for CI and for anyone reading a failure.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for process in (running.redis, running.worker, running.beat, running.web):
        if process.log_path.exists():
            (ARTIFACTS / process.log_path.name).write_text(process.log_text())
