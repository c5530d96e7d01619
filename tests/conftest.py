"""Test configuration: one private environment and one real stack for the whole run.

Importing this sets the environment and Django up and nothing more: the database is
migrated by the `database` fixture, the first time a test asks for it (`stack` does),
and a test that did not ask cannot open a connection. Pure tests touch no database.
"""

from __future__ import annotations

import os
import subprocess
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
    "tests/stack/test_jsonrpc.py",
    "tests/stack/test_jsonrpc_relay.py",
    "tests/access/test_ws_auth.py",
    "tests/transport/test_ws_host.py",
    "tests/stack/test_security.py",
    "tests/transport/test_uploads_asgi.py",
    "tests/stack/test_capabilities_stack.py",
    "tests/stack/test_pdf_resource_limits.py",
    "tests/web/test_downloads.py",
    "tests/stack/test_mcp_inspector.py",
    "tests/stack/test_mcp_typescript.py",
    "tests/stack/test_mcp_fastmcp.py",
    "tests/stack/test_acp_typescript.py",
    "tests/stack/test_acp_python.py",
    "tests/client/test_python_client.py",
    "tests/client/test_cli.py",
    "tests/testing/test_host_project.py",
    "tests/stack/test_storage_s3.py",
    "tests/abpsite/test_production_settings.py",
    "tests/jsonrpc/test_jsonrpc_fuzz.py",
    # What processes do when stopped, and where their spans go: the same on any database.
    "tests/stack/test_drain.py",
    "tests/stack/test_rolling_restart.py",
    "tests/stack/test_traces.py",
)


# Folders whose every test needs the real stack, or servers and processes of its own.
STACK_FOLDERS = ("tests/stack/", "tests/browser/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that need the stack; on PostgreSQL, keep those that reach a database.

    `stack` (`make test-fast` leaves these out): in a stack folder, asking for the
    `stack` fixture, or marked so (a server or process of its own, or Redis).
    A pure test (neither `database` nor `stack`) cannot touch a database: the guard
    below fails it if it tries. Running it again on PostgreSQL would test nothing new.
    """
    for item in items:
        if item.nodeid.startswith(STACK_FOLDERS) or "stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.stack)
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


@pytest.fixture(autouse=True)
def no_process_in_the_fast_lane(request: pytest.FixtureRequest) -> Iterator[None]:
    """`make test-fast` is in-process: a test there that starts a process is marked wrong."""
    if os.environ.get("ABP_TEST_LANE") != "fast" or request.node.get_closest_marker("stack"):
        yield
        return

    def refused(*_: object, **__: object) -> None:
        raise RuntimeError(
            "This test starts a process: mark it `stack` (make test-fast is in-process)."
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", refused)
        patch.setattr(os, "fork", refused)
        yield


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
    from capabilities.lane import lane as local_lane

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
