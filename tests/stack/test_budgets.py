"""Limits that hold before anything is stored, on the real stack.

A second Daphne runs with small limits (the stack's own are generous for the rest of
the suite); its worker keeps the stack's, so a call the consumer lets through would
be stored and run.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from capabilities.access import agent_keys, page_tokens
from capabilities.models import ACTIVE_STATUSES, AgentSession, Job
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.stack import Stack
from tests.support.waiting import eventually

PAGE = "page:127.0.0.1"
LONG = {"steps": 250, "stepMs": 20}  # about 5 s, unless cancelled
SMALL_LIMITS = {
    "ABP_MAX_MARKDOWN_BYTES": "1000",
    "ABP_MAX_HTML_BYTES": "2000",
    "ABP_MAX_IMAGE_BYTES": "3000",
    "ABP_MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": "3",
    "ABP_MAX_OPEN_SESSIONS_PER_PRINCIPAL": "2",
    "ABP_PAGE_TOKEN_MAX_CONCURRENT_CALLS": "1",
    "ABP_PAGE_TOKEN_MAX_PARAMS_BYTES": "500",
    # Long enough that a page's call outlives a busy machine's queue and a second
    # connection (its deadline counts from when it was made).
    "ABP_PAGE_TOKEN_MAX_TIMEOUT_MS": "30000",
    "ABP_PAGE_TOKEN_CAPABILITIES": "convert.markdownToHtml,test.sleep",
}


@pytest.fixture(scope="module")
def limited(stack: Stack) -> Iterator[str]:
    """The base URL of a Daphne with small limits, beside the stack's."""
    with stack.another_web("daphne-limited", SMALL_LIMITS) as where:
        yield where


def ws(limited: str) -> str:
    return f"ws://{limited}/abp/ws"


def new_key() -> str:
    # A key of its own per test: sessions of a closed connection stay open (resumable)
    # for a while, and count against the key's open sessions.
    return agent_keys.create_key("budgets")[1]


def error_of(agent: Agent, call: str) -> dict[str, Any]:
    response = agent.result_of(call)["payload"]
    assert response["success"] is False
    error: dict[str, Any] = response["error"]
    return error


def nothing_stored(agent: Agent, call_id: str) -> bool:
    return not Job.objects.filter(session_id=agent.session_id, call_id=call_id).exists()


# -- sizes before storage ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "params", "path", "limit"),
    [
        ("convert.markdownToHtml", {"markdown": "x" * 1001}, "params.markdown", 1000),
        # 334 three-byte characters: under the limit in characters, over it in bytes.
        ("convert.markdownToHtml", {"markdown": "€" * 334}, "params.markdown", 1000),
        ("export.pdf", {"html": "<p>x</p>" * 251}, "params.html", 2000),
        ("export.pdf", {"content": "<p>x</p>" * 251}, "params.content", 2000),
        ("process.image", {"image": {"content": "QUJD" * 1100}}, "params.image.content", 3000),
    ],
)
def test_an_input_over_its_size_limit_is_refused_before_it_is_stored(
    limited: str, capability: str, params: dict[str, Any], path: str, limit: int
) -> None:
    with Agent(ws(limited), key=new_key()) as agent:
        agent.initialize()
        error = error_of(agent, agent.call(capability, params, call_id="too-big"))
        assert error["code"] == "INVALID_PARAMS"
        assert error["details"] == {"path": path, "rule": "maxLength", "limit": limit}
        assert nothing_stored(agent, "too-big")


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"markdown": "a\x00b"}, "a NUL character"),
        ({"markdown": "a\ud800b"}, "a lone surrogate"),
    ],
)
def test_text_no_store_can_hold_is_refused_before_it_is_stored(
    limited: str, params: dict[str, Any], problem: str
) -> None:
    with Agent(ws(limited), key=new_key()) as agent:
        agent.initialize()
        error = error_of(agent, agent.call("convert.markdownToHtml", params, call_id="bad-text"))
        assert error["code"] == "INVALID_PARAMS"
        assert problem in error["message"]
        assert error["details"]["path"] == "params.markdown"
        assert nothing_stored(agent, "bad-text")


def test_a_nul_in_a_call_id_is_refused(limited: str) -> None:
    with Agent(ws(limited), key=new_key()) as agent:
        agent.initialize()
        error = error_of(agent, agent.call("test.sleep", {"steps": 0}, call_id="a\x00b"))
        assert error["code"] == "INVALID_PARAMS"
        assert error["details"]["path"] == "payload.options.callId"
        assert not Job.objects.filter(session_id=agent.session_id).exists()


def test_the_manifest_shows_the_server_s_limits(limited: str) -> None:
    with urllib.request.urlopen(f"http://{limited}/abp.json", timeout=10) as response:
        manifest = json.load(response)
    entries = {entry["name"]: entry for entry in manifest["capabilities"]}
    markdown = entries["convert.markdownToHtml"]
    assert markdown["inputSchema"]["properties"]["markdown"]["maxLength"] == 1000
    assert markdown["timeout"] == {"defaultMs": 30_000, "maxMs": 120_000}
    assert entries["export.pdf"]["timeout"] == {"defaultMs": 120_000, "maxMs": 900_000}


def test_a_call_without_a_timeout_gets_its_capability_s_default(limited: str) -> None:
    with Agent(ws(limited), key=new_key()) as agent:
        agent.initialize()
        agent.result_of(agent.call("convert.markdownToHtml", {"markdown": "x"}, call_id="md"))
        job = Job.objects.get(session_id=agent.session_id, call_id="md")
        assert job.deadline is not None
        assert (job.deadline - job.created_at).total_seconds() == 30


def test_a_timeout_over_the_capability_s_maximum_is_refused(limited: str) -> None:
    with Agent(ws(limited), key=new_key()) as agent:
        agent.initialize()
        call = agent.call(
            "convert.markdownToHtml", {"markdown": "x"}, call_id="slow", timeout_ms=120_001
        )
        error = error_of(agent, call)
        assert (error["code"], error["details"]["max"]) == ("INVALID_PARAMS", 120_000)
        assert nothing_stored(agent, "slow")


# -- per principal, across sessions -----------------------------------------------------


def test_calls_in_flight_are_limited_across_a_key_s_sessions(limited: str) -> None:
    key = new_key()
    with Agent(ws(limited), key=key) as first, Agent(ws(limited), key=key) as second:
        first.initialize()
        second.initialize()
        first.call("test.sleep", LONG, call_id="a")
        first.call("test.sleep", LONG, call_id="b")
        second.call("test.sleep", LONG, call_id="c")
        # Queued or running, all three are in flight (the worker runs two at a time).
        eventually(
            lambda: (
                Job.objects.filter(principal__startswith="key:")
                .filter(
                    session_id__in=(first.session_id, second.session_id), status__in=ACTIVE_STATUSES
                )
                .count()
                == 3
                or None
            )
        )
        error = error_of(second, second.call("test.sleep", LONG, call_id="d"))
        assert error["code"] == "RATE_LIMITED"
        assert error["details"] == {"limit": "callsInFlight", "max": 3}
        assert nothing_stored(second, "d")
        first.cancel("a")
        eventually(
            lambda: (
                Job.objects.filter(session_id=first.session_id, call_id="a")
                .exclude(status__in=ACTIVE_STATUSES)
                .exists()
            )
        )
        again = second.call("test.sleep", {"steps": 0}, call_id="e")
        assert second.result_of(again)["payload"]["success"] is True


def test_open_sessions_are_limited_per_key(limited: str) -> None:
    key = new_key()
    with Agent(ws(limited), key=key) as first, Agent(ws(limited), key=key) as second:
        first.initialize()
        second.initialize()
        with Agent(ws(limited), key=key) as third:
            reply = third.reply_to(third.send("initialize", {}), "initialize-result")
            error = reply["payload"]["error"]
            assert error["code"] == "RATE_LIMITED"
            assert error["details"] == {"limit": "openSessions", "max": 2}
            with pytest.raises(ConnectionClosed) as closed:
                third.receive(timeout=5)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4429
        first.send("shutdown", {})
        eventually(
            lambda: (
                AgentSession.objects.filter(pk=first.session_id).exclude(closed_at=None).exists()
            )
        )
        with Agent(ws(limited), key=key) as fourth:
            assert fourth.initialize()["payload"]["sessionId"]


# -- page tokens ------------------------------------------------------------------------


def page_agent(limited: str) -> Agent:
    """A connection with a page token, as the app's pages open one."""
    origin = f"http://{limited}"
    token = page_tokens.issue(origin)
    return Agent(
        ws(limited),
        key=None,
        subprotocols=["abp", f"abp.bearer.{token}"],
        additional_headers={"Origin": origin},
    )


def page_budget_unspent() -> None:
    """Wait until other tests' page-token calls and sessions (one budget per address) end."""
    eventually(
        lambda: (
            not Job.objects.filter(principal=PAGE, status__in=ACTIVE_STATUSES).exists()
            and not AgentSession.objects.filter(principal=PAGE, closed_at=None).exists()
        ),
        timeout=30,
    )


@pytest.fixture
def page(limited: str) -> Iterator[Agent]:
    page_budget_unspent()
    with page_agent(limited) as agent:
        agent.initialize()
        yield agent
        shut_down(agent)


def shut_down(agent: Agent) -> None:
    """End a page's session, as the runtime does on pagehide.

    A page session that only drops waits out the grace period for a resume, holding
    the address's budget meanwhile.
    """
    agent.send("shutdown", {})
    assert agent.read_until_closed() == 1000


def test_a_page_token_has_its_own_smaller_concurrency(limited: str, page: Agent) -> None:
    page.call("test.sleep", {"steps": 1500, "stepMs": 20}, call_id="first")  # 30 s
    wait_running(page, "first")
    error = error_of(page, page.call("test.sleep", {"steps": 0}, call_id="second"))
    assert (error["code"], error["details"]["max"]) == ("RATE_LIMITED", 1)
    # Across sessions too: the budget is the client address's.
    with page_agent(limited) as other:
        other.initialize()
        error = error_of(other, other.call("test.sleep", {"steps": 0}, call_id="third"))
        assert (error["code"], error["details"]) == (
            "RATE_LIMITED",
            {"limit": "callsInFlight", "max": 1},
        )
        shut_down(other)
    page.cancel("first")


def test_a_page_token_may_call_only_its_capabilities(page: Agent) -> None:
    error = error_of(page, page.call("export.pdf", {"html": "<p>x</p>"}, call_id="pdf"))
    assert error["code"] == "PERMISSION_DENIED"
    assert nothing_stored(page, "pdf")


def test_a_page_token_s_calls_are_small(page: Agent) -> None:
    call = page.call("convert.markdownToHtml", {"markdown": "x" * 600}, call_id="large")
    error = error_of(page, call)
    assert (error["code"], error["details"]) == ("INVALID_PARAMS", {"path": "params", "limit": 500})
    assert nothing_stored(page, "large")


def test_a_page_token_s_timeouts_are_short(page: Agent) -> None:
    call = page.call("test.sleep", {"steps": 0}, call_id="patient", timeout_ms=30001)
    error = error_of(page, call)
    assert (error["code"], error["details"]["max"]) == ("INVALID_PARAMS", 30000)


def test_a_page_s_dropped_session_is_resumed_by_a_page_only(limited: str) -> None:
    # The browser runtime and bridge resume a dropped socket as any agent does: the
    # session waits, detached, with its call running; only a page's connection with the
    # session's token takes it back.
    page_budget_unspent()
    with page_agent(limited) as agent:
        agent.initialize()
        call = agent.call("test.sleep", LONG, call_id="resumed")
        wait_running(agent, "resumed")
        session_id, token = agent.session_id, agent.resume_token
    assert token is not None
    eventually(lambda: AgentSession.objects.filter(pk=session_id).exclude(detached_at=None).first())
    assert Job.objects.get(session_id=session_id, call_id="resumed").status in ACTIVE_STATUSES
    with Agent(ws(limited), key=new_key()) as keyed:
        refused = keyed.resume(session_id, token)["payload"]["error"]
        assert refused["code"] == "SESSION_INVALID"
    with page_agent(limited) as again:
        assert again.resume(session_id, token)["payload"]["sessionId"] == str(session_id)
        assert again.result_of(call)["payload"]["success"] is True
        shut_down(again)
