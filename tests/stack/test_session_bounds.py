"""Open sessions per principal, on the real stack: what counts, what makes room, what is refused.

A Daphne beside the stack's allows 3 open sessions per key. MCP sessions left open
by clients that never end them make room for new sessions on every door; the rows
of session-less (2026-07-28) calls never count; sessions of a Daphne that is gone
stop counting, and stay resumable; a key's own bound wins over the setting.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from django.core.management import call_command
from django.urls import reverse

from capabilities.access import agent_keys
from capabilities.calls import budgets
from capabilities.models import AgentKey, AgentSession, Door, Job, JobStatus
from tests.support.admin_clients import client_for
from tests.support.agent import Agent
from tests.support.mcp_clients import WIRE_VERSION, RawSession, official_client
from tests.support.rpc_agent import RpcAgent, rpc_url
from tests.support.stack import Stack, free_port, port_open
from tests.support.waiting import eventually, in_thread

pytestmark = pytest.mark.usefixtures("database")

BOUND = 3
# Resumable for 9 s: a session nobody refreshes stops counting after two missed beats
# (6 s), well before the stack's reaper ends it (10 s).
LIMITS = {"ABP_MAX_OPEN_SESSIONS_PER_PRINCIPAL": str(BOUND), "ABP_RESUME_GRACE_SECONDS": "9"}
MARKDOWN = {"markdown": "# Hi"}
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}  # a minute, unless cancelled


@pytest.fixture(scope="module")
def limited(stack: Stack) -> Iterator[str]:
    """host:port of a Daphne allowing BOUND open sessions per key."""
    with stack.another_web("daphne-sessions", LIMITS) as where:
        yield where


def ws(where: str) -> str:
    return f"ws://{where}/abp/ws"


def mcp(where: str) -> str:
    return f"http://{where}/mcp"


def new_key(max_open_sessions: int | None = None) -> tuple[AgentKey, str]:
    key, plaintext = agent_keys.create_key("session bounds")
    key.max_open_sessions = max_open_sessions
    key.save(update_fields=["max_open_sessions"])
    return key, plaintext


def principal_of(key: AgentKey) -> str:
    return f"key:{key.prefix}"


def mcp_rows(key: AgentKey) -> Any:
    return AgentSession.objects.filter(principal=principal_of(key), door=Door.MCP)


async def one_call(session: RawSession, request_id: int = 1) -> dict[str, Any]:
    """A markdown tool call on a raw MCP session; its response."""
    params = {"name": "convert.markdownToHtml", "arguments": MARKDOWN}
    async with session.request(request_id, "tools/call", params) as messages:
        async for message in messages:
            if message.get("id") == request_id:
                return message
    raise AssertionError("no response")


def succeeded(response: dict[str, Any]) -> bool:
    return "result" in response and response["result"].get("isError") is False


async def initialize_refusal(http: httpx2.AsyncClient, where: str, key: str) -> Any:
    """A raw MCP `initialize`: None if admitted, else its JSON-RPC error."""
    session = RawSession(http, mcp(where), key)
    hello = {"name": "refused", "version": "1"}
    params = {"protocolVersion": WIRE_VERSION, "capabilities": {}, "clientInfo": hello}
    async with session.request(0, "initialize", params) as messages:
        async for message in messages:
            return message.get("error")
    raise AssertionError("no response")


# -- clients that never end their sessions ---------------------------------------------------


def test_abandoned_mcp_sessions_never_lock_a_key_out_of_any_door(limited: str) -> None:
    key, plaintext = new_key()

    async def abandon() -> None:
        # The Inspector's pattern: initialize, one call, and never a DELETE.
        async with httpx2.AsyncClient(timeout=30) as http:
            for _ in range(50):
                session = RawSession(http, mcp(limited), plaintext)
                await session.open()
                assert succeeded(await one_call(session))

    anyio.run(abandon)
    assert mcp_rows(key).filter(closed_at=None).count() == BOUND
    assert mcp_rows(key).filter(close_reason=budgets.MADE_ROOM_REASON).count() == 50 - BOUND

    with (
        Agent(ws(limited), key=plaintext) as agent,
        RpcAgent(rpc_url(ws(limited)), key=plaintext) as rpc,
    ):
        assert "error" not in agent.initialize()["payload"]
        result = agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN))
        assert result["payload"]["success"] is True
        rpc.start()
        rpc.result(rpc.call("convert.markdownToHtml", MARKDOWN))

        async def both_mcp_wires() -> None:
            for mode in ("legacy", "auto"):
                async with official_client(mcp(limited), key=plaintext, mode=mode) as client:
                    result = await client.call_tool("convert.markdownToHtml", MARKDOWN)
                    assert result.is_error is False, (mode, result)

        anyio.run(both_mcp_wires)
    # Only MCP sessions were ended to make room.
    made_room = AgentSession.objects.filter(close_reason=budgets.MADE_ROOM_REASON)
    assert set(made_room.filter(principal=principal_of(key)).values_list("door", flat=True)) == {
        Door.MCP
    }


def test_an_mcp_session_ended_to_make_room_is_opened_again_by_its_next_call(
    limited: str,
) -> None:
    key, plaintext = new_key()
    first_id: dict[str, str] = {}

    async def scenario() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            first = RawSession(http, mcp(limited), plaintext)
            await first.open()
            assert succeeded(await one_call(first))
            first_id["id"] = str(uuid.UUID(hex=first.session_id))
            for _ in range(BOUND):
                other = RawSession(http, mcp(limited), plaintext)
                await other.open()
                assert succeeded(await one_call(other))
            row = await in_thread(lambda: AgentSession.objects.get(pk=first_id["id"]))
            assert row.close_reason == budgets.MADE_ROOM_REASON
            # Its SDK session still lives: the next call gets it a place again.
            assert succeeded(await one_call(first, request_id=2))

    anyio.run(scenario)
    row = AgentSession.objects.get(pk=first_id["id"])
    assert (row.closed_at, row.close_reason) == (None, "")
    assert Job.objects.filter(session=row).count() == 2
    assert mcp_rows(key).filter(closed_at=None).count() == BOUND


def test_mcp_refuses_at_initialize_when_nothing_can_make_room(limited: str) -> None:
    key, plaintext = new_key()
    with Agent(ws(limited), key=plaintext) as first, Agent(ws(limited), key=plaintext) as second:
        first.initialize()
        second.initialize()

        async def scenario() -> None:
            async with httpx2.AsyncClient(timeout=90) as http:
                busy = RawSession(http, mcp(limited), plaintext)
                await busy.open()
                # With progress, the stream's first event (and so its headers) comes at once.
                meta = {"progressToken": "busy"}
                params = {"name": "test.sleep", "arguments": LONG, "_meta": meta}
                async with busy.request(1, "tools/call", params):
                    session_id = uuid.UUID(hex=busy.session_id)
                    # In a thread that closes its connection (psycopg warns otherwise).
                    await in_thread(
                        lambda: eventually(
                            lambda: Job.objects.filter(
                                session_id=session_id, status=JobStatus.RUNNING
                            ).exists()
                        )
                    )
                    # Two live sockets and an MCP session with a call in flight: no room.
                    error = await initialize_refusal(http, limited, plaintext)
                    assert error is not None
                    assert error["data"]["code"] == "RATE_LIMITED"
                    assert error["data"]["details"] == {"limit": "openSessions", "max": BOUND}
                    await busy.notify("notifications/cancelled", {"requestId": 1})

        anyio.run(scenario)
    assert mcp_rows(key).count() == 1


# -- session-less calls ------------------------------------------------------------------------


@pytest.mark.parametrize("calls", [20, 100])
def test_concurrent_session_less_calls_are_never_refused_for_sessions(
    limited: str, calls: int
) -> None:
    key, plaintext = new_key()
    results: list[Any] = []

    async def scenario() -> None:
        async with official_client(mcp(limited), key=plaintext, mode="auto") as client:

            async def call(n: int) -> None:
                results.append(
                    await client.call_tool("convert.markdownToHtml", {"markdown": f"# {n}"})
                )

            async with anyio.create_task_group() as group:
                for n in range(calls):
                    group.start_soon(call, n)

    anyio.run(scenario)
    refused = [result.structured_content for result in results if result.is_error]
    assert refused == []
    assert len(results) == calls
    rows = mcp_rows(key)
    assert rows.filter(per_call=True).count() == calls
    assert not rows.filter(closed_at=None).exists()


# -- a Daphne that is gone ---------------------------------------------------------------------


def test_a_session_held_by_a_daphne_that_is_gone_stops_counting_and_stays_resumable(
    stack: Stack, limited: str
) -> None:
    _, plaintext = new_key(max_open_sessions=1)
    port = free_port()
    doomed = stack.new_web(port, name="daphne-doomed", env=LIMITS)
    doomed.start(lambda: port_open(port))
    try:
        lost = Agent(f"ws://127.0.0.1:{port}/abp/ws", key=plaintext)
        lost.initialize()
        session_id, token = lost.session_id, lost.resume_token
    finally:
        doomed.kill()
    with contextlib.suppress(Exception):
        lost.close()
    assert token is not None

    def admitted() -> Agent | None:
        agent = Agent(ws(limited), key=plaintext)
        if "error" not in agent.initialize()["payload"]:
            return agent
        agent.close()
        return None

    with eventually(admitted, timeout=30):
        # Admitted while the lost session is still open: it no longer counted.
        assert AgentSession.objects.get(pk=session_id).closed_at is None
        with Agent(ws(limited), key=plaintext) as again:
            reply = again.resume(session_id, token)["payload"]
            assert reply.get("sessionId") == str(session_id), reply


# -- a key's own bound -------------------------------------------------------------------------


def test_a_key_s_own_bound_wins_over_the_setting(limited: str) -> None:
    _, plaintext = new_key(max_open_sessions=BOUND + 2)
    with contextlib.ExitStack() as held:
        for _ in range(BOUND + 2):
            agent = held.enter_context(Agent(ws(limited), key=plaintext))
            assert "error" not in agent.initialize()["payload"]
        with Agent(ws(limited), key=plaintext) as refused:
            error = refused.initialize()["payload"]["error"]
            assert error["code"] == "RATE_LIMITED"
            assert error["details"] == {"limit": "openSessions", "max": BOUND + 2}
            assert refused.read_until_closed() == 4429


def test_the_bound_of_a_key_is_set_by_the_command_and_in_the_admin() -> None:
    out = io.StringIO()
    call_command("create_agent_key", "fleet", "--max-open-sessions", "300", "--quiet", stdout=out)
    key = agent_keys.find_key(out.getvalue().strip())
    assert key is not None
    assert key.max_open_sessions == 300
    client = client_for(staff=True)
    change = reverse("admin:capabilities_agentkey_change", args=[key.pk])
    assert 'name="max_open_sessions"' in client.get(change).content.decode()
    response = client.post(change, {"name": "fleet", "max_open_sessions": "500"})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.max_open_sessions == 500
