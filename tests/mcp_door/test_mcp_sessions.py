"""`mcp_door.sessions.session_for` in process: a session-less call's row and cancels.

A client's cancel can land while the call's row is being written in the database
thread. The row is written to the end and then closed: none is left open.
The write is held at the seam (`session_records.record_session`) until the cancel
has landed, so the cancel always falls inside it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from capabilities.access import agent_keys
from capabilities.access.principal import Principal
from capabilities.calls import held_sessions, session_records
from capabilities.mcp_door import sessions
from capabilities.models import AgentSession

pytestmark = pytest.mark.usefixtures("database")


def session_less_request() -> Any:
    """What session_for reads of a 2026-07-28 request: no connection, no session id."""
    return cast(
        Any,
        SimpleNamespace(
            session=SimpleNamespace(client_params=None),
            params=None,
            request=None,
            protocol_version="2026-07-28",
        ),
    )


def new_principal() -> Principal:
    key, _ = agent_keys.create_key("session_for")
    return Principal(kind="key", key=key, client_address="127.0.0.1")


class HeldWrite:
    """`record_session`, held until released; says when a write has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.begun = threading.Event()
        self.release = threading.Event()
        real = session_records.record_session

        def held(*args: Any, **kwargs: Any) -> None:
            self.begun.set()
            assert self.release.wait(30)
            real(*args, **kwargs)

        monkeypatch.setattr(session_records, "record_session", held)

    async def wait_begun(self) -> None:
        assert await anyio.to_thread.run_sync(self.begun.wait, 30)


def rows_of(principal: Principal) -> Any:
    return AgentSession.objects.filter(principal=principal.rate_limit_id)


def test_a_session_less_call_gets_a_per_call_row_that_is_no_open_session() -> None:
    principal = new_principal()
    found: dict[str, Any] = {}

    async def scenario() -> None:
        session_id, own = await sessions.session_for(session_less_request(), principal)
        found.update(session_id=session_id, own=own, held=held_sessions.held())
        await sessions.end_session(session_id)

    anyio.run(scenario)
    assert found["own"] is True
    assert found["session_id"] in found["held"]  # seen while its call runs
    row = rows_of(principal).get()
    assert str(row.pk) == found["session_id"]
    assert row.per_call is True
    assert row.closed_at is not None
    assert found["session_id"] not in held_sessions.held()


def test_an_asyncio_cancel_during_the_write_leaves_no_row_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    principal = new_principal()
    write = HeldWrite(monkeypatch)

    async def scenario() -> None:
        task = asyncio.ensure_future(sessions.session_for(session_less_request(), principal))
        await write.wait_begun()
        task.cancel()
        write.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    anyio.run(scenario)
    assert rows_of(principal).count() == 1  # written meanwhile...
    assert not rows_of(principal).filter(closed_at=None).exists()  # ...and closed
    assert not held_sessions.held()


def test_an_anyio_cancel_during_the_write_leaves_no_row_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    principal = new_principal()
    write = HeldWrite(monkeypatch)
    returned: list[tuple[str, bool]] = []

    async def call() -> None:
        returned.append(await sessions.session_for(session_less_request(), principal))

    async def scenario() -> None:
        # As the SDK cancels a request's handler: its cancel scope.
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await write.wait_begun()
            group.cancel_scope.cancel()
            write.release.set()

    anyio.run(scenario)
    assert returned == []
    assert rows_of(principal).count() == 1
    assert not rows_of(principal).filter(closed_at=None).exists()
    assert not held_sessions.held()


def test_a_delete_for_a_session_not_open_here_is_not_remembered() -> None:
    # Another Daphne's session, or one already gone: nothing here would ever forget it.
    elsewhere = "0" * 31 + "1"
    sessions.mark_ending(elsewhere)
    assert not sessions.is_ending(str(uuid.UUID(hex=elsewhere)))
    here = uuid.uuid4()
    sessions._open.add(str(here))
    try:
        sessions.mark_ending(here.hex)
        assert sessions.is_ending(str(here))
    finally:
        sessions._open.discard(str(here))
        sessions._ending.discard(str(here))
