"""Resuming sessions on the real stack: dropped sockets, other Daphnes, a Daphne killed.

The test stack's grace period is 5 s (tests/support/environment.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from websockets.exceptions import ConnectionClosed

from capabilities.access import agent_keys
from capabilities.endings import resumption
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.support.agent import Agent, Envelope
from tests.support.jobs import wait_running
from tests.support.stack import ManagedProcess, Stack
from tests.support.waiting import eventually

LONG = {"steps": 100, "stepMs": 20}  # about 2 s


def call_results(agent: Agent, call_id: str, settle_for: float = 0.5) -> list[Envelope]:
    """Every call-result for callId that arrives within `settle_for` s of the last message."""
    try:
        while True:
            agent.receive(timeout=settle_for)
    except TimeoutError:
        pass
    return agent.results_for_call(call_id)


def dropped(stack: Stack, url: str | None = None) -> tuple[Agent, uuid.UUID, str]:
    """An initialized agent (its socket still open), its session id and resume token."""
    agent = Agent(url or stack.ws_url)
    payload = agent.initialize()["payload"]
    return agent, uuid.UUID(payload["sessionId"]), payload["resumeToken"]


def wait_detached(session_id: uuid.UUID) -> AgentSession:
    return eventually(AgentSession.objects.filter(pk=session_id, detached_at__isnull=False).first)


def test_initialize_result_carries_a_resume_token_kept_only_hashed(agent: Agent) -> None:
    token = agent.resume_token
    assert token is not None
    assert len(token) >= 40
    session = AgentSession.objects.get(pk=agent.session_id)
    assert session.resume_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in session.resume_hash


def test_a_call_in_flight_is_answered_on_the_resumed_connection(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    call = first.call("test.sleep", LONG, call_id="keeps-running")
    wait_running(first, "keeps-running")
    first.close()
    wait_detached(session_id)
    # The drop cancelled nothing.
    job = Job.objects.get(session_id=session_id, call_id="keeps-running")
    assert job.status == JobStatus.RUNNING

    with Agent(stack.ws_url) as second:
        reply = second.resume(session_id, token)["payload"]
        assert reply["sessionId"] == str(session_id)
        assert reply["resumeToken"] != token
        result = second.result_of(call)["payload"]
        assert result["success"] is True
        assert len(call_results(second, "keeps-running")) == 1
        # The resumed connection holds the call: cancelling another one works too.
        other = second.call("test.sleep", LONG, call_id="after-resume")
        wait_running(second, "after-resume")
        cancel = second.reply_to(second.cancel("after-resume"), "capabilities/cancel-result")
        assert cancel["payload"]["cancelled"] is True
        assert second.result_of(other)["payload"]["cancelled"] is True
    delivered = Job.objects.get(pk=job.pk)
    assert delivered.delivered_at is not None


def test_results_settled_while_away_are_delivered_once(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    calls = {
        call_id: first.call("test.sleep", {"steps": 10, "echo": call_id}, call_id=call_id)
        for call_id in ("a", "b", "c")
    }
    eventually(lambda: Job.objects.filter(session_id=session_id).count() == 3)
    first.close()
    eventually(
        lambda: Job.objects.filter(session_id=session_id, status=JobStatus.SUCCEEDED).count() == 3
    )
    undelivered = Job.objects.filter(session_id=session_id, delivered_at__isnull=True).count()
    assert undelivered >= 1  # settled after the drop (most likely all three)

    with Agent(stack.ws_url) as second:
        second.resume(session_id, token)
        for call_id in calls:
            results = call_results(second, call_id, settle_for=0.3)
            if Job.objects.get(session_id=session_id, call_id=call_id).delivered_at is None:
                pytest.fail(f"{call_id} not recorded as delivered")
            assert len(results) <= 1
        received = {
            e["payload"]["callId"] for e in second.inbox if e["type"].endswith("call-result")
        }
        newer_token = second.resume_token
    assert received  # those the first connection had not been sent
    assert newer_token is not None
    # Delivered is delivered: a later resume gets nothing again.
    with Agent(stack.ws_url) as third:
        third.resume(session_id, newer_token)
        for call_id in calls:
            assert call_results(third, call_id, settle_for=0.3) == []


def test_a_resume_with_a_wrong_token_or_key_is_session_invalid(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    first.close()
    wait_detached(session_id)
    stranger_key = agent_keys.create_key("stranger")[1]
    attempts: list[tuple[str, str | None, uuid.UUID | str, str]] = [
        (stack.ws_url, None, session_id, "not-the-token"),
        (stack.ws_url, stranger_key, session_id, token),  # another agent's key
        (stack.ws_url, None, "not-a-uuid", token),
        (stack.ws_url, None, "00000000-0000-0000-0000-000000000000", token),
    ]
    for url, key, sid, guess in attempts:
        with Agent(url, **({"key": key} if key else {})) as intruder:
            reply = intruder.resume(sid, guess)["payload"]
            assert reply["error"]["code"] == "SESSION_INVALID"
            assert "sessionId" not in reply
    # Failed attempts do not burn the token; a used token does not work twice.
    with Agent(stack.ws_url) as owner:
        assert owner.resume(session_id, token)["payload"]["sessionId"] == str(session_id)
    with Agent(stack.ws_url) as late:
        assert late.resume(session_id, token)["payload"]["error"]["code"] == "SESSION_INVALID"


def test_a_session_not_resumed_in_time_is_expired(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    first.call("test.sleep", {"steps": 2000}, call_id="abandoned")
    wait_running(first, "abandoned")
    first.close()
    job = eventually(
        Job.objects.filter(
            session_id=session_id, call_id="abandoned", status=JobStatus.CANCELLED
        ).first,
        timeout=resumption.grace().total_seconds() + 5,
    )
    assert job.cancel_source == CancelSource.DISCONNECT
    with Agent(stack.ws_url) as late:
        reply = late.resume(session_id, token)["payload"]
    assert reply["error"]["code"] == "SESSION_EXPIRED"


def test_resuming_while_the_old_socket_is_open_takes_the_session_over(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    call = first.call("test.sleep", {"steps": 30}, call_id="handed-over")
    wait_running(first, "handed-over")
    with Agent(stack.ws_url) as second:
        second.resume(session_id, token)
        assert first.read_until_closed() == 4409
        assert second.result_of(call)["payload"]["success"] is True
        assert len(call_results(second, "handed-over")) == 1
    assert first.results_for_call("handed-over") == []
    # Taken over, not detached: the session stays open for the new connection.
    assert AgentSession.objects.get(pk=session_id).close_reason == ""


@pytest.fixture
def second_daphne(stack: Stack) -> Iterator[str]:
    with stack.another_web("daphne-2") as where:
        yield f"ws://{where}/abp/ws"


def test_a_session_resumes_through_another_daphne(stack: Stack, second_daphne: str) -> None:
    first, session_id, token = dropped(stack)
    call = first.call("test.sleep", LONG, call_id="crosses")
    wait_running(first, "crosses")
    first.close()
    wait_detached(session_id)
    with Agent(second_daphne) as elsewhere:
        assert elsewhere.resume(session_id, token)["payload"]["sessionId"] == str(session_id)
        assert elsewhere.result_of(call)["payload"]["success"] is True
        assert len(call_results(elsewhere, "crosses")) == 1


def test_a_killed_daphne_is_restarted_and_its_sessions_resumed(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    call = first.call("test.sleep", LONG, call_id="survives")
    wait_running(first, "survives")
    killed: ManagedProcess = stack.web
    killed.kill()  # SIGKILL by PID: no disconnect handler runs
    started = time.monotonic()
    stack.start_web()
    restart_seconds = time.monotonic() - started
    assert restart_seconds < resumption.grace().total_seconds()
    with pytest.raises((ConnectionClosed, TimeoutError, OSError)):
        first.receive(timeout=2)
    with Agent(stack.ws_url) as again:
        assert again.resume(session_id, token)["payload"]["sessionId"] == str(session_id)
        assert again.result_of(call)["payload"]["success"] is True
        assert len(call_results(again, "survives")) == 1


ROUNDS = int(os.environ.get("ABP_RAPID_DROP_ROUNDS", "30"))


class Reconnecting:
    """One session over a series of connections, each dropped and resumed."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        agent = Agent(stack.ws_url)
        # Notifications on: more frames in flight as each socket is dropped.
        payload = agent.initialize(notifications=True)["payload"]
        self.session_id, self.token = payload["sessionId"], payload["resumeToken"]
        self.connections = [agent]

    @property
    def agent(self) -> Agent:
        return self.connections[-1]

    def drop_and_resume(self) -> None:
        self.agent.ws.close()
        self.agent.read_until_closed()
        again = Agent(self.stack.ws_url)
        reply = again.resume(self.session_id, self.token, notifications=True)
        self.token = reply["payload"]["resumeToken"]
        self.connections.append(again)

    def results_for(self, call_id: str) -> list[Envelope]:
        return [r for agent in self.connections for r in agent.results_for_call(call_id)]


def test_calls_made_through_rapid_drops_are_each_answered_once(stack: Stack) -> None:
    """Calls sent right before the agent drops the socket, resumed at once, many times.

    Found by tests/stack/test_interleavings.py: a call whose frame arrived as the agent
    dropped was created after the resuming connection had read the session's
    calls, and its result reached nobody.
    """
    # Each step: a call (callId, steps, timeout) or a drop and resume (None).
    plan: list[tuple[str, int, int | None] | None] = [
        None,
        None,
        ("c1", 2, 120),
        ("c2", 2, None),
        None,
        ("c3", 0, None),
        None,
        None,
        None,
        ("c4", 10, 120),
        None,
        ("c5", 3, None),
    ]
    calls = [step[0] for step in plan if step is not None]
    for _ in range(ROUNDS):
        session = Reconnecting(stack)
        for step in plan:
            if step is None:
                session.drop_and_resume()
            else:
                call_id, steps, timeout_ms = step
                session.agent.call(
                    "test.sleep",
                    {"steps": steps, "stepMs": 10},
                    call_id=call_id,
                    timeout_ms=timeout_ms,
                )
        last = session.agent
        cancel = last.reply_to(last.cancel("c4"), "capabilities/cancel-result")["payload"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            session.results_for(call_id) for call_id in calls
        ):
            with contextlib.suppress(TimeoutError):
                last.receive(timeout=0.2)
        for call_id in calls:
            assert len(session.results_for(call_id)) == 1, (call_id, session.results_for(call_id))
        [c4] = session.results_for("c4")
        assert bool(cancel["cancelled"]) == bool(c4["payload"].get("cancelled"))
        for connection in session.connections:
            connection.close()


def test_a_result_nobody_sent_reaches_the_connection_holding_the_session(agent: Agent) -> None:
    """The reaper's safety net under the hand-over between a session's connections."""
    settled = timezone.now() - timedelta(seconds=3)
    Job.objects.create(
        session_id=agent.session_id,
        call_id="orphan",
        request_id="r-orphan",
        capability="test.sleep",
        status=JobStatus.SUCCEEDED,
        result={"echo": "found"},
        settled_at=settled,
        created_at=settled,
    )
    result = agent.wait_for(
        lambda e: e["type"] == "capabilities/call-result" and e["id"] == "r-orphan"
    )["payload"]
    assert result["data"]["echo"] == "found"
    assert len(call_results(agent, "orphan")) == 1
    assert Job.objects.get(session_id=agent.session_id, call_id="orphan").delivered_at


def test_a_shutdown_answers_calls_another_connection_of_the_session_created(
    stack: Stack,
) -> None:
    agent, session_id, _ = dropped(stack)
    # As if created by another connection of the session a moment ago.
    Job.objects.create(
        session_id=session_id,
        call_id="elsewhere",
        request_id="r-elsewhere",
        capability="test.sleep",
        deadline=timezone.now() + timedelta(minutes=1),
    )
    agent.send("shutdown", {})
    assert agent.read_until_closed() == 1000
    [result] = agent.results_for_call("elsewhere")
    assert result["payload"]["cancelled"] is True
    job = Job.objects.get(session_id=session_id, call_id="elsewhere")
    assert job.cancel_source == CancelSource.SHUTDOWN


def test_a_resent_call_whose_result_went_to_the_dropped_socket_is_sent_again(
    stack: Stack,
) -> None:
    # Its row was answered on the old connection (here read, as if it died unread, or
    # written after the resume read the session's calls): the copy the agent re-sends
    # is that call, claimed for the new connection and answered once more.
    first, session_id, token = dropped(stack)
    asked = first.call("test.sleep", {"steps": 0, "echo": "once"}, call_id="gone")
    assert first.result_of(asked)["payload"]["success"] is True
    first.close()
    wait_detached(session_id)
    with Agent(stack.ws_url) as second:
        second.resume(session_id, token)
        second.call("test.sleep", {"steps": 0, "echo": "once"}, call_id="gone", resent=True)
        again = second.result_of(asked)["payload"]  # answered as its first copy asked
        assert again["success"] is True
        assert len(call_results(second, "gone")) == 1
        # Claimed for this generation now: a copy re-sent again is answered once only.
        second.call("test.sleep", {"steps": 0, "echo": "once"}, call_id="gone", resent=True)
        assert len(call_results(second, "gone")) == 1
    job = Job.objects.get(session_id=session_id, call_id="gone")
    assert job.delivered_generation == AgentSession.objects.get(pk=session_id).generation
