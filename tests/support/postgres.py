"""A database of its own on a PostgreSQL server, for one test module or benchmark run.

The server is TEST_DATABASE_URL's (default `postgresql://postgres@127.0.0.1:5432/postgres`,
which `make test-postgres` and CI provide). `TemporaryDatabase` creates
`abp_<purpose>_<random>` there, migrates it by running the service's own migrate command
in a subprocess (with DATABASE_URL pointing at it), and drops it at the end, whatever
connections the stack's processes left open.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_url() -> str:
    """Where the PostgreSQL server is (a database on it to connect to for CREATE/DROP)."""
    return os.environ.get("TEST_DATABASE_URL") or DEFAULT_SERVER_URL


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` on the same server."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


class TemporaryDatabase:
    """CREATE DATABASE on `start`, DROP (closing whatever is still connected) on `drop`."""

    def __init__(self, purpose: str, server: str | None = None) -> None:
        self.name = f"abp_{purpose}_{secrets.token_hex(4)}"
        self.server = server or server_url()
        self.url = with_database(self.server, self.name)

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.server, autocommit=True, connect_timeout=10)

    def create(self) -> None:
        """Create the empty database."""
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))

    def migrate(self, command: Sequence[str], env: Mapping[str, str], timeout: float = 180) -> None:
        """Run the service's migrate `command` (from the repository root) against it."""
        done = subprocess.run(
            list(command),
            cwd=ROOT,
            env={**env, "DATABASE_URL": self.url},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def connect(self) -> psycopg.Connection[Any]:
        """A connection to it (autocommit), for the test's own queries."""
        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def query(self, statement: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
        """Rows of one query."""
        with self.connect() as connection:
            return connection.execute(statement, params).fetchall()

    def drop(self) -> None:
        """Drop it, ending the sessions the stack's processes left behind."""
        with self._admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            )
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


def reachable() -> str | None:
    """None if the server answers; else why not (for a clear failure message)."""
    try:
        with psycopg.connect(server_url(), autocommit=True, connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        return f"PostgreSQL at {server_url()} not reachable: {error}"
    return None
