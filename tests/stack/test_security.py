"""The attack list, against the real stack: each attempt refused with its code.

Who may connect (keys, page tokens, origins), what a session may touch (only its
own calls) and the limits (rate, concurrency, timeout, frame size).
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from capabilities.access import agent_keys, page_tokens
from capabilities.conf import abp_settings
from capabilities.endings import key_revocation
from capabilities.models import AgentKey, AgentSession, CancelSource, Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running, wait_stopped
from tests.support.stack import Stack
from tests.support.waiting import eventually


def refusal(agent: Agent) -> tuple[dict[str, Any], int]:
    """The error a refused connection is told, and its close code."""
    note = agent.wait_for(lambda e: e["type"] == "notification")
    assert note["payload"]["event"] == "notifications/error"
    with pytest.raises(ConnectionClosed) as closed:
        agent.receive(timeout=5)
    assert closed.value.rcvd is not None
    return note["payload"]["data"], closed.value.rcvd.code


def assert_refused(agent: Agent, reason: str, close_code: int) -> None:
    error, code = refusal(agent)
    assert error["code"] == "PERMISSION_DENIED"
    assert error["details"] == {"reason": reason, "closeCode": close_code}
    assert code == close_code


def new_key(**limits: Any) -> str:
    return agent_keys.create_key("attack-list", **limits)[1]


def origin_of(stack: Stack) -> str:
    return stack.http_url.rstrip("/")


# -- who may connect --------------------------------------------------------------------


def test_no_credentials_is_refused(stack: Stack) -> None:
    with Agent(stack.ws_url, key=None) as agent:
        assert_refused(agent, "missing-credentials", 4401)


@pytest.mark.parametrize(
    "key",
    [
        "abp_0000000000_" + "x" * 43,  # well formed, no such key
        "not-a-key-at-all",
        "abp_",
    ],
)
def test_wrong_key_is_refused(stack: Stack, key: str) -> None:
    with Agent(stack.ws_url, key=key) as agent:
        assert_refused(agent, "invalid-credentials", 4401)


def test_right_prefix_wrong_secret_is_refused(stack: Stack) -> None:
    real = new_key()
    forged = real[: real.rindex("_") + 1] + "y" * 43
    with Agent(stack.ws_url, key=forged) as agent:
        assert_refused(agent, "invalid-credentials", 4401)


def test_frames_from_a_refused_connection_do_nothing(stack: Stack) -> None:
    with Agent(stack.ws_url, key=None) as agent:
        with contextlib.suppress(ConnectionClosed):  # the close may be there first
            agent.send("initialize", {"agent": {"name": "sneaky"}, "protocolVersion": "0.1"})
        refusal(agent)
    assert not AgentSession.objects.filter(agent_name="sneaky").exists()


def test_a_key_works_in_each_place_a_client_can_put_it(stack: Stack) -> None:
    key = new_key()
    ways: list[dict[str, Any]] = [
        {"key": key},
        {"key": None, "subprotocols": ["abp", f"abp.bearer.{key}"]},
        {"key": None, "url": f"{stack.ws_url}?access_token={key}"},
    ]
    for way in ways:
        url = way.pop("url", stack.ws_url)
        with Agent(url, **way) as agent:
            session_id = agent.initialize()["payload"]["sessionId"]
            if "subprotocols" in way:
                assert agent.ws.subprotocol == "abp"
        session = AgentSession.objects.select_related("agent_key").get(pk=session_id)
        assert session.auth == "key"
        assert session.agent_key is not None
        assert key.startswith(f"abp_{session.agent_key.prefix}_")
    assert AgentKey.objects.get(prefix=agent_keys.prefix_of(key)).last_used_at is not None


def test_revoked_key_is_refused(stack: Stack) -> None:
    key = new_key()
    key_revocation.revoke(AgentKey.objects.filter(prefix=agent_keys.prefix_of(key)))
    with Agent(stack.ws_url, key=key) as agent:
        assert_refused(agent, "key-revoked", 4403)


def test_revoking_a_key_closes_its_connections_and_answers_their_calls(stack: Stack) -> None:
    key = new_key()
    with Agent(stack.ws_url, key=key) as agent, Agent(stack.ws_url) as bystander:
        agent.initialize()
        bystander.initialize()
        call = agent.call("test.sleep", {"steps": 500}, call_id="long")
        wait_running(agent, "long")
        bystander_call = bystander.call("test.sleep", {"steps": 1}, call_id="b")

        key_revocation.revoke(AgentKey.objects.filter(prefix=agent_keys.prefix_of(key)))

        result = agent.result_of(call)["payload"]
        assert result["cancelled"] is True
        assert result["error"]["code"] == "CANCELLED"
        assert_refused(agent, "key-revoked", 4403)
        assert len(agent.results_for_call("long")) == 1
        job = wait_stopped(agent, "long")
        assert job.status == JobStatus.CANCELLED
        assert job.cancel_source == CancelSource.OPERATOR
        # Another key's connection is untouched.
        assert bystander.result_of(bystander_call)["payload"]["success"] is True


def test_a_revocation_left_half_done_is_finished_by_the_reaper(stack: Stack) -> None:
    key = new_key()
    with Agent(stack.ws_url, key=key) as agent:
        agent.initialize()
        call = agent.call("test.sleep", {"steps": 500}, call_id="long")
        wait_running(agent, "long")
        # Redis restarting as the key is revoked: neither the cancel's abort nor the
        # connections hear of it, and the call stays running.
        with (
            mock.patch("capabilities.endings.cancellation.cancel"),
            mock.patch("capabilities.jobs.notes.notify_group", return_value=False),
        ):
            revoked = key_revocation.revoke(
                AgentKey.objects.filter(prefix=agent_keys.prefix_of(key))
            )
        assert revoked == 1
        assert Job.objects.get(session_id=agent.session_id, call_id="long").status == (
            JobStatus.RUNNING
        )
        # The beat's reaper (every 0.5 s here) finishes it.
        result = agent.result_of(call, timeout=30)["payload"]
        assert result["cancelled"] is True
        assert_refused(agent, "key-revoked", 4403)
        job = wait_stopped(agent, "long")
        assert job.cancel_source == CancelSource.OPERATOR
    eventually(lambda: key_revocation.finish_revocations() == 0)


def test_disallowed_browser_origin_is_refused_at_the_upgrade(stack: Stack) -> None:
    for origin in ("https://evil.example", "http://localhost:1234", "null"):
        with pytest.raises(InvalidStatus) as refused:
            Agent(stack.ws_url, additional_headers={"Origin": origin})
        assert refused.value.response.status_code == 403


def test_allowed_browser_origin_with_a_key_connects(stack: Stack) -> None:
    with Agent(stack.ws_url, additional_headers={"Origin": origin_of(stack)}) as agent:
        assert agent.initialize()["payload"]["sessionId"]


def _with_page_token(stack: Stack, token: str, origin: str | None = None) -> Agent:
    return Agent(
        stack.ws_url,
        key=None,
        subprotocols=["abp", f"abp.bearer.{token}"],
        additional_headers={"Origin": origin or origin_of(stack)},
    )


def test_page_token_opens_a_session(stack: Stack) -> None:
    with _with_page_token(stack, page_tokens.issue(origin_of(stack))) as agent:
        session_id = agent.initialize()["payload"]["sessionId"]
    session = AgentSession.objects.get(pk=session_id)
    assert (session.auth, session.agent_key) == ("page", None)


def test_forged_page_token_is_refused(stack: Stack) -> None:
    genuine = page_tokens.issue(origin_of(stack))
    forged = genuine[:-4] + ("AAAA" if not genuine.endswith("AAAA") else "BBBB")
    with _with_page_token(stack, forged) as agent:
        assert_refused(agent, "invalid-credentials", 4401)


def test_expired_page_token_is_refused(stack: Stack) -> None:
    issued_long_ago = time.time() - page_tokens.max_age() - 5
    with mock.patch("django.core.signing.time.time", return_value=issued_long_ago):
        expired = page_tokens.issue(origin_of(stack))
    with _with_page_token(stack, expired) as agent:
        error, code = refusal(agent)
    assert (error["details"]["reason"], code) == ("expired-credentials", 4419)
    assert error["retryable"] is True


def test_page_token_of_another_origin_is_refused(stack: Stack) -> None:
    # Issued to pages of another (allowed) origin, replayed from this one.
    other = page_tokens.issue("http://127.0.0.1:1")
    with _with_page_token(stack, other) as agent:
        assert_refused(agent, "invalid-credentials", 4401)


def test_page_token_outside_a_browser_is_refused(stack: Stack) -> None:
    token = page_tokens.issue(origin_of(stack))
    with Agent(stack.ws_url, key=token) as agent:  # no Origin header
        assert_refused(agent, "invalid-credentials", 4401)


def test_page_token_endpoint_gives_fresh_tokens(stack: Stack) -> None:
    with urllib.request.urlopen(f"{stack.http_url}/abp/page-token/", timeout=10) as response:
        assert response.headers["Cache-Control"].startswith("max-age=0")
        body = response.read().decode()
    assert '"maxAgeSeconds": 600' in body


# -- what a session may touch --------------------------------------------------------------


@pytest.fixture
def two_agents(stack: Stack) -> Iterator[tuple[Agent, Agent]]:
    with Agent(stack.ws_url, key=new_key()) as a, Agent(stack.ws_url, key=new_key()) as b:
        a.initialize()
        b.initialize()
        yield a, b


def test_session_b_cannot_cancel_session_a_call(two_agents: tuple[Agent, Agent]) -> None:
    a, b = two_agents
    call = a.call("test.sleep", {"steps": 20}, call_id="mine")
    wait_running(a, "mine")
    reply = b.reply_to(b.cancel("mine"), "capabilities/cancel-result")["payload"]
    assert reply == {"callId": "mine", "cancelled": False, "reason": "Operation not found"}
    assert a.result_of(call)["payload"]["success"] is True


def test_session_b_cannot_resume_session_a(stack: Stack, two_agents: tuple[Agent, Agent]) -> None:
    a, _ = two_agents
    with Agent(stack.ws_url, key=new_key()) as b:
        resume = {"sessionId": str(a.session_id), "token": "guessed"}
        message = b.send("initialize", {"agent": {"name": "b"}, "resume": resume})
        reply = b.reply_to(message, "initialize-result")["payload"]
    assert reply["error"]["code"] == "SESSION_INVALID"
    assert "sessionId" not in reply


def test_session_b_cannot_download_session_a_result(
    stack: Stack, two_agents: tuple[Agent, Agent]
) -> None:
    a, b = two_agents
    big = 400 * 1024  # above the test stack's inline limit: a download link
    a_call = a.call("test.sleep", {"steps": 1, "fileBytes": big}, call_id="file")
    b_call = b.call("test.sleep", {"steps": 1, "fileBytes": big}, call_id="file")
    a_url = a.result_of(a_call)["payload"]["data"]["file"]["downloadUrl"]
    b_url = b.result_of(b_call)["payload"]["data"]["file"]["downloadUrl"]
    a_token = a_url.split("/abp/files/")[1].split("/")[0]
    b_token = b_url.split("/abp/files/")[1].split("/")[0]
    assert a_token != b_token
    assert len(b_token) > 40
    # B's own link works; pointing it at A's job (any byte changed) does not.
    assert _status(b_url) == 200
    # A token is payload:timestamp:signature. B's signature on A's payload, A's on
    # B's, and B's token with its signature changed are all refused.
    a_payload, a_signed = a_token.split(":", 1)
    b_payload, b_signed = b_token.split(":", 1)
    last = "A" if b_token[-1] != "A" else "B"
    forgeries = {f"{a_payload}:{b_signed}", f"{b_payload}:{a_signed}", b_token[:-1] + last}
    assert b_token not in forgeries
    for forged in forgeries:
        assert _status(b_url.replace(b_token, forged)) == 403


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


# -- limits ---------------------------------------------------------------------------------


def test_flood_over_the_rate_limit_is_refused_with_retry_after(stack: Stack) -> None:
    with Agent(stack.ws_url, key=new_key(calls_per_minute=3)) as agent:
        agent.initialize()
        calls = [agent.call("test.sleep", {"steps": 1}, call_id=f"c{n}") for n in range(5)]
        payloads = [agent.result_of(call)["payload"] for call in calls]
        session_id = agent.session_id
    assert [p["success"] for p in payloads[:3]] == [True, True, True]
    for refused in payloads[3:]:
        error = refused["error"]
        assert error["code"] == "RATE_LIMITED"
        assert error["retryable"] is True
        assert 0 < error["retryAfter"] <= 60_000
        assert error["details"] == {"limit": "callsPerMinute", "max": 3}
    assert not Job.objects.filter(session_id=session_id, call_id__in=["c3", "c4"]).exists()


def test_rate_limit_is_per_key_across_connections(stack: Stack) -> None:
    key = new_key(calls_per_minute=2)
    for expected in (True, True, False):
        with Agent(stack.ws_url, key=key) as agent:
            agent.initialize()
            payload = agent.result_of(agent.call("test.sleep", {"steps": 1}))["payload"]
            assert payload["success"] is expected


def test_calls_beyond_the_session_queue_are_refused(stack: Stack) -> None:
    with Agent(stack.ws_url, key=new_key(max_queued_calls=2)) as agent:
        agent.initialize()
        agent.call("test.sleep", {"steps": 500}, call_id="one")
        agent.call("test.sleep", {"steps": 500}, call_id="two")
        third = agent.result_of(agent.call("test.sleep", {"steps": 1}, call_id="three"))
        error = third["payload"]["error"]
        assert error["code"] == "RATE_LIMITED"
        assert error["retryAfter"] > 0
        assert "queued or running in one session" in error["message"]
        assert error["details"] == {"limit": "queuedCalls", "max": 2}
        assert not Job.objects.filter(session_id=agent.session_id, call_id="three").exists()
        # A slot frees when a call is answered.
        agent.reply_to(agent.cancel("one"), "capabilities/cancel-result")
        again = agent.call("test.sleep", {"steps": 1}, call_id="three")
        assert agent.result_of(again)["payload"]["success"] is True
        agent.reply_to(agent.cancel("two"), "capabilities/cancel-result")


def test_timeout_over_the_maximum_is_refused(agent: Agent) -> None:

    too_long = abp_settings().MAX_TIMEOUT_MS + 1
    payload = agent.result_of(agent.call("test.sleep", {}, timeout_ms=too_long))["payload"]
    assert payload["error"]["code"] == "INVALID_PARAMS"
    assert payload["error"]["details"]["path"] == "payload.options.timeout"


def test_oversized_frame_closes_with_1009(agent: Agent) -> None:
    agent.send_raw("x" * (2 * 1024 * 1024))
    with pytest.raises(ConnectionClosed) as closed:
        agent.receive(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


def test_sessions_record_who_opened_them(agent: Agent) -> None:
    sessions = AgentSession.objects.filter(pk=agent.session_id).select_related("agent_key")
    session = eventually(sessions.first)
    assert session.auth == "key"
    assert session.agent_key is not None
    assert session.agent_key.name == "the test suite"
    assert session.client_address == "127.0.0.1"
