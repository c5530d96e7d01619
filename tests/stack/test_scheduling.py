"""Scheduling on the real stack: fair shares, queued batches, availability from live workers.

The heavy worker runs two jobs at once (tests/support/stack.py), so two running
jobs fill it and the rest wait in the database for a slot.
"""

from __future__ import annotations

import itertools
import json
import random
import urllib.request
from collections.abc import Callable
from typing import Any

from capabilities.access import agent_keys
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.agent import Agent, Envelope
from tests.support.jobs import wait_running
from tests.support.stack import Stack
from tests.support.waiting import eventually

SHORT = {"mode": "checkpoint", "steps": 4, "stepMs": 40}  # about 0.2 s
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}  # a minute, unless cancelled
TINY = {"mode": "checkpoint", "steps": 1, "stepMs": 2}


def new_key(name: str, **limits: Any) -> str:
    return agent_keys.create_key(name, **limits)[1]


def job_of(agent: Agent, call_id: str) -> Job:
    return Job.objects.get(session_id=agent.session_id, call_id=call_id)


def progress_of(token: str, position: int) -> Callable[[Envelope], bool]:
    def matches(envelope: Envelope) -> bool:
        payload = envelope["payload"]
        return bool(
            envelope["type"] == "progress"
            and payload.get("operationId") == token
            and payload.get("stage") == "queued"
            and payload.get("position") == position
        )

    return matches


def availability_changed(capability: str, available: bool) -> Callable[[Envelope], bool]:
    def matches(envelope: Envelope) -> bool:
        payload = envelope["payload"]
        if envelope["type"] != "notification":
            return False
        if payload.get("event") != "notifications/capabilities/changed":
            return False
        states = {c["name"]: c["available"] for c in payload["data"]["capabilities"]}
        return states.get(capability) is available

    return matches


def manifest(base_url: str) -> dict[str, bool]:
    with urllib.request.urlopen(f"{base_url}/abp.json", timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return {entry["name"]: entry["available"] for entry in document["capabilities"]}


# -- fair shares --------------------------------------------------------------------------


def test_a_second_agent_starts_when_one_job_ends_not_after_the_first_agents_batch(
    stack: Stack,
) -> None:
    with (
        Agent(stack.ws_url, key=new_key("batch agent")) as first,
        Agent(stack.ws_url, key=new_key("single-call agent")) as second,
    ):
        first.initialize()
        second.initialize()
        batch = [first.call("test.sleep", SHORT, call_id=f"a{n}") for n in range(12)]
        wait_running(first, "a0")
        wait_running(first, "a1")
        single = second.call("test.sleep", SHORT, call_id="b")
        assert second.result_of(single)["payload"]["success"] is True
        for call in batch:
            assert first.result_of(call)["payload"]["success"] is True
        theirs = job_of(second, "b")
        assert theirs.dispatched_at is not None
        # Counted from when "b" was stored, not from when it was sent: on a loaded
        # machine two of the batch may end (and two more start) before the call lands.
        overtaking = Job.objects.filter(
            session_id=first.session_id,
            dispatched_at__gt=theirs.created_at,
            dispatched_at__lt=theirs.dispatched_at,
        ).count()
    # It took the first slot that freed once it waited, not one after all twelve.
    # The batch runs in pairs, so both slots free at once, and pumps that read the
    # queue just before "b" committed may give that pair to the batch.
    assert overtaking <= 2


def test_an_agent_runs_no_more_jobs_at_once_than_its_share(stack: Stack) -> None:
    with Agent(stack.ws_url, key=new_key("share of one", max_concurrent_calls=1)) as agent:
        agent.initialize()
        calls = [agent.call("test.sleep", SHORT, call_id=f"c{n}") for n in range(3)]
        for call in calls:
            assert agent.result_of(call)["payload"]["success"] is True
        jobs = sorted(Job.objects.filter(session_id=agent.session_id), key=lambda job: job.call_id)
    # One after the other: each started once the one before had stopped.
    for earlier, later in itertools.pairwise(jobs):
        assert earlier.stopped_at is not None
        assert later.started_at is not None
        assert later.started_at >= earlier.stopped_at


# -- queued batches -----------------------------------------------------------------------


def test_a_batch_of_200_is_queued_and_each_call_answered_once_with_cancels_among_them(
    stack: Stack,
) -> None:
    rng = random.Random(13)
    with Agent(stack.ws_url, key=new_key("batch of 200", max_concurrent_calls=2)) as agent:
        agent.initialize()
        # Two long jobs fill the agent's share: the other 198 wait in the database.
        calls = {f"c{n}": agent.call("test.sleep", LONG, call_id=f"c{n}") for n in range(2)}
        calls |= {f"c{n}": agent.call("test.sleep", TINY, call_id=f"c{n}") for n in range(2, 200)}
        waiting = rng.sample(range(2, 200), 30)
        running = [0, 1]
        racing = rng.sample(sorted(set(range(2, 200)) - set(waiting)), 10)
        cancels = {f"c{n}": agent.cancel(f"c{n}") for n in waiting}
        # Freeing the share lets the rest through; these cancels race the dispatcher.
        cancels |= {f"c{n}": agent.cancel(f"c{n}") for n in running + racing}
        confirmations = {
            call_id: agent.reply_to(message_id, "capabilities/cancel-result")["payload"]
            for call_id, message_id in cancels.items()
        }
        results = {
            call_id: agent.result_of(message_id, timeout=60)["payload"]
            for call_id, message_id in calls.items()
        }
        # Anything sent twice would arrive close behind: read on for a moment.
        try:
            while True:
                agent.receive(timeout=1.0)
        except TimeoutError:
            pass
        for call_id in calls:
            assert len(agent.results_for_call(call_id)) == 1, call_id
        jobs = {job.call_id: job for job in Job.objects.filter(session_id=agent.session_id)}

    for call_id, payload in results.items():
        confirmed = confirmations.get(call_id, {}).get("cancelled") is True
        assert payload["success"] is not confirmed, call_id
        assert bool(payload.get("cancelled")) is confirmed, call_id
    for n in waiting:
        job = jobs[f"c{n}"]
        # Settled at once, and no worker ever saw it.
        assert confirmations[f"c{n}"]["cancelled"] is True
        assert job.status == JobStatus.CANCELLED
        assert job.cancel_source == CancelSource.AGENT
        assert (job.dispatched_at, job.started_at, job.worker) == (None, None, "")
    for n in running:
        assert jobs[f"c{n}"].started_at is not None
        assert results[f"c{n}"]["cancelled"] is True
    succeeded = [job for job in jobs.values() if job.status == JobStatus.SUCCEEDED]
    assert len(succeeded) >= 200 - len(cancels)


def test_a_queued_call_hears_its_place_in_line(stack: Stack) -> None:
    with Agent(stack.ws_url, key=new_key("line", max_concurrent_calls=1)) as agent:
        agent.initialize()
        first = agent.call("test.sleep", LONG, call_id="first", progress_token="p1")
        wait_running(agent, "first")
        second = agent.call("test.sleep", TINY, call_id="second", progress_token="p2")
        third = agent.call("test.sleep", TINY, call_id="third", progress_token="p3")
        assert agent.wait_for(progress_of("p2", 1))["payload"]["status"] == "queued"
        agent.wait_for(progress_of("p3", 2))
        # The line moves when the running job ends.
        agent.cancel("first")
        assert agent.result_of(first)["payload"]["cancelled"] is True
        agent.wait_for(progress_of("p3", 1))
        assert agent.result_of(second)["payload"]["success"] is True
        assert agent.result_of(third)["payload"]["success"] is True


# -- availability -------------------------------------------------------------------------


def test_a_capability_no_live_worker_consumes_is_refused_at_once(stack: Stack) -> None:
    nowhere = {"ABP_CAPABILITY_QUEUES": "test.sleep=abp.nobody"}
    with stack.another_web("daphne-no-worker", nowhere) as where:
        with Agent(f"ws://{where}/abp/ws") as agent:
            opened = agent.initialize()["payload"]
            states = {c["name"]: c["available"] for c in opened["capabilities"]}
            assert states["test.sleep"] is False
            assert states["convert.markdownToHtml"] is True
            error = agent.result_of(agent.call("test.sleep", TINY, call_id="x"))["payload"]["error"]
            assert not Job.objects.filter(session_id=agent.session_id, call_id="x").exists()
        listed = manifest(f"http://{where}")
    assert error["code"] == "CAPABILITY_UNAVAILABLE"
    assert error["retryable"] is True
    assert error["retryAfter"] > 0
    assert error["details"] == {"capability": "test.sleep", "queue": "abp.nobody"}
    assert (listed["test.sleep"], listed["export.pdf"]) == (False, True)


def test_a_worker_killed_by_pid_flips_availability_and_one_started_again_flips_it_back(
    stack: Stack,
) -> None:
    with Agent(stack.ws_url) as agent:
        agent.initialize(notifications=True)
        stack.worker.kill()
        # Made before the worker's key expired: accepted, and it waits for a worker.
        waiting = agent.call("test.sleep", TINY, call_id="waits-for-a-worker")
        try:
            gone = agent.wait_for(availability_changed("export.pdf", False), timeout=15)
            states = {c["name"]: c["available"] for c in gone["payload"]["data"]["capabilities"]}
            # The small queue's worker still runs.
            assert states["convert.markdownToHtml"] is True
            refused = agent.result_of(agent.call("export.pdf", {"html": "<p>x</p>"}))
            assert refused["payload"]["error"]["code"] == "CAPABILITY_UNAVAILABLE"
            assert manifest(stack.http_url)["export.pdf"] is False
        finally:
            stack.start_worker()
        agent.wait_for(availability_changed("export.pdf", True), timeout=15)
        assert agent.result_of(waiting, timeout=30)["payload"]["success"] is True
        done = agent.result_of(agent.call("test.sleep", TINY))
        assert done["payload"]["success"] is True
    eventually(lambda: manifest(stack.http_url)["export.pdf"] or None)
