"""A stateful MCP session closes when its access is withdrawn, once its waiting calls have
answered; on Channels' in-memory layer, the SDK's side at its seam (no stack)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import pytest
from channels.layers import get_channel_layer
from django.test import override_settings

from capabilities.jobs import notes
from capabilities.mcp_door import call_watch, sdk_seams
from capabilities.models import AgentSession, Door, session_group

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

pytestmark = pytest.mark.usefixtures("database")


@pytest.fixture(autouse=True)
def in_memory_layer() -> Iterator[None]:
    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        yield


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happened, in order; the SDK's connection ended at its seam."""
    happened: list[str] = []

    async def end_connection(connection: Any) -> bool:
        happened.append(connection)
        return True

    monkeypatch.setattr(sdk_seams, "end_connection", end_connection)
    monkeypatch.setattr(call_watch, "LINGER_SECONDS", 0.0)
    return happened


def open_session() -> str:
    return str(AgentSession.objects.create(agent_name="withdrawal", door=Door.MCP).pk)


def row(session_id: str) -> AgentSession:
    return AgentSession.objects.get(pk=session_id)


async def listening_to(session_id: str) -> asyncio.Task[None]:
    """The session's listener, once it has joined the session's group."""
    layer: Any = get_channel_layer()
    joined = asyncio.Event()
    group_add = layer.group_add

    async def noted(group: str, channel: str) -> None:
        await group_add(group, channel)
        joined.set()

    layer.group_add = noted
    listener = call_watch.close_when_withdrawn(session_id, cast(Any, "the connection"))
    await asyncio.wait_for(joined.wait(), 5)
    return listener


def test_a_withdrawn_session_closes_after_its_waiting_call_answered(events: list[Any]) -> None:
    session_id = open_session()

    async def scenario() -> None:
        layer: Any = get_channel_layer()
        listening = await listening_to(session_id)
        async with call_watch.watching(session_id):
            await layer.group_send(session_group(session_id), notes.job_settled("c-1"))
            await layer.group_send(
                session_group(session_id), notes.agent_key_revoked("user-inactive")
            )
            await asyncio.sleep(0.05)  # the listener hears it, and waits for this call
            events.append("answered")
        await asyncio.wait_for(listening, 5)

    asyncio.run(scenario())
    assert events == ["answered", "the connection"]
    closed = row(session_id)
    assert closed.closed_at is not None
    assert closed.close_reason == "user deactivated"


def test_a_session_that_ends_first_stops_listening(events: list[Any]) -> None:
    session_id = open_session()

    async def scenario() -> bool:
        layer: Any = get_channel_layer()
        listening = await listening_to(session_id)
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        return bool(layer.groups.get(session_group(session_id)))

    assert asyncio.run(scenario()) is False
    assert events == []
    assert row(session_id).closed_at is None


def test_a_revoked_keys_session_closes_with_that_reason(events: list[Any]) -> None:
    session_id = open_session()

    async def scenario() -> None:
        layer: Any = get_channel_layer()
        listening = await listening_to(session_id)
        await layer.group_send(session_group(session_id), notes.agent_key_revoked())
        await asyncio.wait_for(listening, 5)

    asyncio.run(scenario())
    assert events == ["the connection"]
    assert row(session_id).close_reason == "agent key revoked"
