"""Test configuration: one private environment and one real stack for the whole run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import environment
from tests.support.agent import Agent
from tests.support.stack import Stack

STACK = environment.prepare("abp-test-")
ARTIFACTS = Path(
    os.environ.get("ABP_TEST_ARTIFACTS", Path(__file__).parent.parent / "var" / "test-artifacts")
)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The real stack: Redis, Celery worker and beat, Daphne."""
    try:
        STACK.start()
        yield STACK
    finally:
        STACK.stop()
        _keep_logs(STACK)
        STACK.remove_files()


@pytest.fixture
def agent(stack: Stack) -> Iterator[Agent]:
    """An initialized agent on the real stack (its own session)."""
    connected = Agent(stack.ws_url)
    connected.initialize()
    yield connected
    connected.close()


def _keep_logs(running: Stack) -> None:
    # Logs of the processes are kept for CI and for anyone reading a failure.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for process in (running.redis, running.worker, running.beat, running.web):
        if process.log_path.exists():
            (ARTIFACTS / process.log_path.name).write_text(process.log_text())
