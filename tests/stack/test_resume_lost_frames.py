"""Frames lost with a dropped socket are recovered on resume (docs/protocol.md).

A resume names the calls the agent still awaits (`resume.awaiting`); the reply lists
those the server holds (`heldCalls`) and answers again the ones whose results died
unread with the old socket. A call the server never got is sent again, marked
`resent`: it runs then, and a callId the session already holds never runs twice.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from abp_jobs_client import AsyncClient

from capabilities.models import Job, JobStatus
from tests.stack.test_resume import call_results, dropped, wait_detached
from tests.support.agent import Agent
from tests.support.frame_relay import FrameRelay
from tests.support.jobs import wait_running
from tests.support.stack import Stack
from tests.support.waiting import eventually

LONG = {"steps": 100, "stepMs": 20}  # about 2 s


def test_a_resume_lists_the_awaited_calls_the_server_holds(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    running = first.call("test.sleep", LONG, call_id="running")
    answered = first.call("test.sleep", {"steps": 1, "echo": "answered"}, call_id="answered")
    assert first.result_of(answered)["payload"]["success"] is True
    wait_running(first, "running")
    first.close()
    wait_detached(session_id)

    with Agent(stack.ws_url) as second:
        awaiting = ["running", "answered", "never-sent"]
        reply = second.resume(session_id, token, awaiting=awaiting)["payload"]
        assert sorted(reply["heldCalls"]) == ["answered", "running"]
        # Delivered once already, but the agent says it never read it: sent again.
        [again] = call_results(second, "answered", settle_for=0.3)
        assert again["id"] == answered
        assert again["payload"]["data"]["echo"] == "answered"
        assert second.result_of(running)["payload"]["success"] is True
        assert len(call_results(second, "running")) == 1


def test_a_resume_without_awaiting_lists_the_unanswered_calls(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    first.call("test.sleep", LONG, call_id="in-flight")
    wait_running(first, "in-flight")
    first.close()
    wait_detached(session_id)
    with Agent(stack.ws_url) as second:
        assert second.resume(session_id, token)["payload"]["heldCalls"] == ["in-flight"]


def test_a_resent_call_the_server_never_got_runs_once(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    first.close()
    wait_detached(session_id)
    with Agent(stack.ws_url) as second:
        reply = second.resume(session_id, token, awaiting=["lost"])["payload"]
        assert reply["heldCalls"] == []
        sent = second.call("test.sleep", {"steps": 1, "echo": "lost"}, call_id="lost", resent=True)
        assert second.result_of(sent)["payload"]["data"]["echo"] == "lost"
    assert Job.objects.filter(session_id=session_id, call_id="lost").count() == 1


def test_a_resent_call_the_server_holds_is_not_run_twice(stack: Stack) -> None:
    first, session_id, token = dropped(stack)
    envelope_id = first.call("test.sleep", LONG, call_id="twice")
    wait_running(first, "twice")
    first.close()
    wait_detached(session_id)
    with Agent(stack.ws_url) as second:
        second.resume(session_id, token, awaiting=["twice"])
        # As a client would that missed the reply: the same frame, marked resent.
        second.call("test.sleep", LONG, call_id="twice", resent=True, message_id=envelope_id)
        result = second.result_of(envelope_id)["payload"]
        assert result["success"] is True
        assert len(call_results(second, "twice")) == 1  # no refusal, no second answer
    job = Job.objects.get(session_id=session_id, call_id="twice")
    assert job.status == JobStatus.SUCCEEDED


def test_the_python_client_sends_a_call_lost_with_the_socket_again(stack: Stack) -> None:
    relay = FrameRelay(stack.ws_url)

    async def scenario() -> tuple[str | None, dict[str, object]]:
        async with AsyncClient(relay.url, key=os.environ["ABP_TEST_AGENT_KEY"]) as client:
            relay.lose_call("lost-in-flight")
            handle = await client.start(
                "test.sleep", {"steps": 1, "echo": "recovered"}, call_id="lost-in-flight"
            )
            result = await asyncio.wait_for(handle.result(), 30)
            return client.session_id, result.data

    try:
        session_id, data = asyncio.run(scenario())
    finally:
        relay.close()
    assert relay.lost == ["lost-in-flight"]  # the first copy never reached the app
    assert relay.connections >= 2  # answered on the resumed connection
    assert data["echo"] == "recovered"
    assert session_id is not None
    jobs = eventually(
        lambda: list(Job.objects.filter(session_id=uuid.UUID(session_id), call_id="lost-in-flight"))
    )
    assert len(jobs) == 1
    assert jobs[0].status == JobStatus.SUCCEEDED
