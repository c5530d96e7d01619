"""Test configuration: one private environment and one real stack for the whole run.

Importing this sets the environment and Django up and nothing more: the database is
migrated by the `database` fixture, the first time a test asks for it (`stack` does),
and a test that did not ask cannot open a connection. Pure tests touch no database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import environment
from tests.support.agent import Agent
from tests.support.database_guard import DatabaseGuard
from tests.support.stack import Stack

STACK = environment.configure("abp-test-")
DATABASE_GUARD = DatabaseGuard()
DATABASE_GUARD.install()
ARTIFACTS = Path(
    os.environ.get("ABP_TEST_ARTIFACTS", Path(__file__).parent.parent / "var" / "test-artifacts")
)


# What the PostgreSQL pass leaves to `make test` (docs/testing.md): the pages'
# JavaScript in Chromium; third-party clients and tools at the doors (SDKs in other
# languages, the Inspector, fastmcp, our client and CLI, a host project, S3,
# `check --deploy`); and the doors' own framing, authentication, host and upload
# checks, and what the capabilities do with their input. Below the door they drive
# the call service every other test drives on PostgreSQL too; the database under it
# changes nothing they check. What stays: races, settles, budgets, dispatch, resume,
# sessions, the admin, retention, metrics, and the several-node and production stacks.
SQLITE_PASS_ONLY = (
    "tests/browser/",
    "tests/test_jsonrpc.py",
    "tests/test_jsonrpc_relay.py",
    "tests/test_ws_auth.py",
    "tests/test_ws_host.py",
    "tests/test_security.py",
    "tests/test_uploads_asgi.py",
    "tests/test_capabilities_stack.py",
    "tests/test_pdf_resource_limits.py",
    "tests/test_downloads.py",
    "tests/test_mcp_inspector.py",
    "tests/test_mcp_typescript.py",
    "tests/test_mcp_fastmcp.py",
    "tests/test_acp_typescript.py",
    "tests/test_acp_python.py",
    "tests/test_python_client.py",
    "tests/test_cli.py",
    "tests/test_host_project.py",
    "tests/test_storage_s3.py",
    "tests/test_production_settings.py",
    "tests/test_jsonrpc_fuzz.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The PostgreSQL pass runs the tests that reach a database, and no other.

    A pure test (neither `database` nor `stack`) cannot touch one: the guard below
    fails it if it tries. Running it again on PostgreSQL would test nothing new.
    """
    if not environment.use_postgres():
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        reaches = {"database", "stack"} & set(getattr(item, "fixturenames", ()))
        where = item.nodeid
        again = reaches and not where.startswith(SQLITE_PASS_ONLY)
        (kept if again or item.get_closest_marker("postgres") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any of the test's fixtures: its module- or session-scoped ones may query.
    DATABASE_GUARD.allowed = "database" in getattr(item, "fixturenames", ())


def pytest_sessionfinish() -> None:
    # A run that never started the stack still leaves its directory behind otherwise.
    STACK.remove_files()
    DATABASE_GUARD.uninstall()
    # A PostgreSQL run's database (make test-postgres) is dropped with the run.
    environment.remove_database()


@pytest.fixture(autouse=True)
def no_local_lane_in_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers run in this process (WebsocketCommunicator) start no local lane.

    The stack's Daphnes have theirs; one here would fork processes from pytest.
    """
    from capabilities.calls import local_lane

    monkeypatch.setattr(local_lane, "start_soon", lambda: None)


@pytest.fixture(scope="session")
def database() -> None:
    """The run's database (SQLite, or PostgreSQL), migrated, with the suite's agent key."""
    environment.migrate()


@pytest.fixture(scope="session")
def stack(database: None) -> Iterator[Stack]:
    """The real stack: Redis, Celery worker and beat, Daphne (on the migrated database)."""
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
