"""One private environment for a test or benchmark run, set before Django loads.

The environment points at a private database, a Redis on a free port and a
temporary media root; the processes of the stack (tests/support/stack.py) inherit
it, so this process sees the same DB as Daphne and the worker.

The database is a temporary SQLite file, or, with ABP_TEST_DATABASE=postgres (what
`make test-postgres` sets), a fresh PostgreSQL database `abp_test_<random>` on the
server TEST_DATABASE_URL names (default: postgres@127.0.0.1:5432), dropped when the
run ends (`remove_database`, and at exit in case nobody called it).

`configure` only sets the environment and Django up: nothing touches the database
until `migrate` (the test suite runs it in its `database` fixture, so pure tests
never do). `prepare` does both, for the benchmarks.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.stack import Stack, free_port


def use_postgres() -> bool:
    """Whether this run's database is PostgreSQL (ABP_TEST_DATABASE=postgres)."""
    return os.environ.get("ABP_TEST_DATABASE", "sqlite") == "postgres"


class PostgresDatabase:
    """A database of this run's own on the test server, created now, dropped once."""

    def __init__(self, server: str | None = None) -> None:
        import psycopg

        from tests.support.postgres import TemporaryDatabase

        self._database = TemporaryDatabase("test", server)
        self.url = self._database.url
        # Only the process that created it drops it (not a forked child at its exit).
        self._owner = os.getpid()
        self._dropped = False
        try:
            self._database.create()
        except psycopg.Error as exc:
            parts = urlsplit(self._database.server)
            where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"  # no password
            raise RuntimeError(
                f"cannot create a test database on the PostgreSQL server at {where} "
                f"(TEST_DATABASE_URL): {exc}"
            ) from exc
        atexit.register(self.drop)

    def drop(self) -> None:
        """Drop the database, ending whatever is still connected to it."""
        if self._dropped or os.getpid() != self._owner:
            return
        self._dropped = True
        from django.db import connections

        connections.close_all()
        self._database.drop()


_postgres: PostgresDatabase | None = None


def database_url(run_dir: Path) -> str:
    """The run's DATABASE_URL: a new PostgreSQL database, or SQLite in `run_dir`."""
    global _postgres  # noqa: PLW0603 - one database per run
    if not use_postgres():
        return f"sqlite:///{run_dir / 'db.sqlite3'}"
    if _postgres is None:
        _postgres = PostgresDatabase()
    return _postgres.url


def remove_database() -> None:
    """Drop the run's PostgreSQL database, if it has one (SQLite goes with its folder)."""
    if _postgres is not None:
        _postgres.drop()


def prepare(prefix: str, **overrides: str) -> Stack:
    """Set the environment, set Django up, migrate; returns the (unstarted) stack."""
    stack = configure(prefix, **overrides)
    migrate()
    return stack


def configure(prefix: str, **overrides: str) -> Stack:
    """Set the environment and set Django up, without touching the database."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    redis_port = free_port()
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            # Production settings, as shipped: every security default on.
            "DJANGO_ENV": "production",
            "DJANGO_SECRET_KEY": "test-only-secret-key-" + "x1y2z3" * 8,
            "DJANGO_DEBUG": "0",
            # Browsers open the WebSocket from the test server's pages (any port: the
            # stack picks a free one when it starts).
            "ABP_ALLOWED_ORIGINS": "http://127.0.0.1:*",
            # Generous: the suite's shared key makes thousands of calls; the limit
            # tests use keys with limits of their own.
            "ABP_MAX_CONCURRENT_CALLS": "1000",
            "ABP_CALLS_PER_MINUTE": "1000000",
            "ABP_MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": "1000",
            "ABP_MAX_OPEN_SESSIONS_PER_PRINCIPAL": "1000",
            # The browser tests' pages hold page tokens: as generous as keys here; the
            # page-budget tests set their own.
            "ABP_PAGE_TOKEN_MAX_CONCURRENT_CALLS": "1000",
            "ABP_PAGE_TOKEN_CALLS_PER_MINUTE": "1000000",
            "DATABASE_URL": overrides.get("DATABASE_URL") or database_url(run_dir),
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "DJANGO_MEDIA_ROOT": str(run_dir / "media"),
            "DJANGO_LOG_LEVEL": "INFO",
            "ABP_REAPER_INTERVAL_SECONDS": "0.5",
            "ABP_HARD_KILL_GRACE_SECONDS": "1.5",
            "ABP_WORKER_LOST_AFTER_SECONDS": "3",
            # Under the above, as the system check asks.
            "ABP_LOCAL_LANE_TIME_LIMIT_SECONDS": "1.5",
            # Live workers: quick to appear and to expire, so availability tests are short.
            "ABP_WORKER_ANNOUNCE_SECONDS": "0.5",
            "ABP_WORKER_TTL_SECONDS": "2",
            "ABP_AVAILABILITY_POLL_SECONDS": "0.25",
            # Lower than the product's: every job of the suite fits (a child is ~400 MiB
            # of address space), and tests/stack/test_worker_memory_limit.py's bombs stay small.
            "ABP_WORKER_MEMORY_LIMIT_MB": "1024",
            # Long enough to restart a Daphne and resume; short enough that tests of
            # a session nobody resumes wait only a few seconds.
            "ABP_RESUME_GRACE_SECONDS": "10",
            "ABP_MAX_FRAME_BYTES": str(1024 * 1024),
            # Small, so that tests see both inline results and download URLs.
            "ABP_INLINE_RESULT_MAX_BYTES": str(256 * 1024),
            "ABP_EMBED_ALLOWED_ORIGINS": f"http://127.0.0.1:{free_port()}",  # tests/browser/
            **overrides,
        }
    )
    import django

    django.setup()
    return Stack(run_dir, redis_port)


def migrate() -> None:
    """Create the run's tables and the key every test agent connects with."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from capabilities.access.agent_keys import create_key

    # The key every test agent connects with unless it says otherwise.
    _, os.environ["ABP_TEST_AGENT_KEY"] = create_key("the test suite")
