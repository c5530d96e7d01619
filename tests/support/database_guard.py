"""Database connections only for the tests that ask for the `database` fixture.

Without it a pure test that reached the ORM by accident would pass or fail by the
order the suite runs in (the tables exist once any DB test has migrated); with it
that test fails at once, saying what to ask for.
"""

from __future__ import annotations

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper


class DatabaseNotAllowed(RuntimeError):
    """A test that did not ask for the database opened a connection."""


class DatabaseGuard:
    """Refuses every new database connection in this process unless `allowed`."""

    def __init__(self) -> None:
        self.allowed = False
        self._patch = pytest.MonkeyPatch()

    def install(self) -> None:
        """Guard Django's one door to a new connection, `ensure_connection`."""
        real = BaseDatabaseWrapper.ensure_connection

        def ensure_connection(connection: BaseDatabaseWrapper) -> None:
            # One a test before it opened in a shared thread is only looked at
            # (Channels' clean-up after a close asks it for its autocommit).
            if not self.allowed and connection.connection is None:
                raise DatabaseNotAllowed(
                    "this test uses the database: ask for the `database` fixture "
                    "(or `stack`, which needs it)"
                )
            real(connection)

        self._patch.setattr(BaseDatabaseWrapper, "ensure_connection", ensure_connection)

    def uninstall(self) -> None:
        """Let every connection through again."""
        self._patch.undo()
