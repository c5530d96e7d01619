"""The local lane (capabilities/lane/) on the real stack, and its parts.

The stack's Daphne runs small Markdown calls in its lane, as the product does. A
second Daphne beside it (`lane_web`) also takes the test capabilities into its lane,
so that runs long enough to cancel, time out, exhaust memory or outlive their
Daphne can be made.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.endings import cancellation
from capabilities.jobs.heartbeat_thread import HeartbeatThread
from capabilities.lane import child, pool
from capabilities.lane import lane as local_lane
from capabilities.lane.states import LaneEvent, LaneState
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode
from tests.support.agent import Agent
from tests.support.stack import ManagedProcess, Stack, free_port, port_open
from tests.support.waiting import eventually, seconds_between

SMALL = {"markdown": "# Title\n\nSome *text*."}
LANE_ENV = {
    "ABP_LOCAL_LANE_CAPABILITIES": "convert.markdownToHtml,test.sleep,test.allocate",
    "ABP_LOCAL_LANE_MEMORY_LIMIT_MB": "512",
}

# Python-Markdown recurses once per level of Markdown inside HTML on every Python; a
# nested list recurses only on 3.11 (3.12 and 3.13 convert it at any depth).
NESTED_TOO_DEEPLY = '<div markdown="1">\n' * 1500 + "x\n" + "</div>\n" * 1500


def job_of(agent: Agent, call_id: str) -> Job:
    return Job.objects.get(session_id=agent.session_id, call_id=call_id)


def call_until_local(agent: Agent, capability: str, params: dict[str, Any]) -> Job:
    """Make calls until one runs in the lane (it starts with the first connection)."""
    deadline = time.monotonic() + 20
    n = 0
    while time.monotonic() < deadline:
        n += 1
        call_id = f"warm-{n}"
        result = agent.result_of(agent.call(capability, params, call_id=call_id))
        assert result["payload"]["success"] is True, result
        job = job_of(agent, call_id)
        if job.queue == local_lane.LOCAL_QUEUE:
            return job
        time.sleep(0.1)
    raise AssertionError("no call ran in the local lane")


@pytest.fixture(scope="module")
def lane_web(stack: Stack) -> Iterator[ManagedProcess]:
    """A Daphne beside the stack's whose lane also takes the test capabilities."""
    port = free_port()
    web = stack.new_web(port, name="daphne-lane", env=LANE_ENV)
    web.start(lambda: port_open(port))
    web.port = port  # type: ignore[attr-defined]
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def lane_agent(lane_web: ManagedProcess) -> Iterator[Agent]:
    with Agent(f"ws://127.0.0.1:{lane_web.port}/abp/ws") as agent:  # type: ignore[attr-defined]
        agent.initialize()
        call_until_local(agent, "test.sleep", {"steps": 0})
        yield agent


# -- the product's lane: small Markdown calls ------------------------------------------


def test_a_small_markdown_call_runs_in_the_lane_settled_and_claimed_at_once(
    agent: Agent,
) -> None:
    job = call_until_local(agent, "convert.markdownToHtml", SMALL)
    assert job.worker.startswith("local@")
    assert job.status == JobStatus.SUCCEEDED
    assert job.result == {"html": "<h1>Title</h1>\n<p>Some <em>text</em>.</p>"}
    for stamp in (job.dispatched_at, job.started_at, job.stopped_at, job.delivered_at):
        assert stamp is not None
    # Written running: the row was there before the work, and it started as written.
    assert job.started_at == job.created_at
    assert len(agent.results_for_call(job.call_id)) == 1


def test_a_large_markdown_call_goes_through_celery(agent: Agent) -> None:
    call_until_local(agent, "convert.markdownToHtml", SMALL)
    large = {"markdown": "word " * 20_000}  # over LOCAL_LANE_MAX_PARAMS_BYTES
    result = agent.result_of(agent.call("convert.markdownToHtml", large, call_id="large"))
    assert result["payload"]["success"] is True
    job = job_of(agent, "large")
    assert job.queue != local_lane.LOCAL_QUEUE
    assert not job.worker.startswith("local@")


# -- cancels, limits and failures, in the second Daphne's lane --------------------------


def test_a_cancel_kills_the_local_run_and_the_lane_goes_on(lane_agent: Agent) -> None:
    # Blocked in C (time.sleep): only killing its process stops it.
    params = {"mode": "block", "steps": 1, "stepMs": 60_000}
    call = lane_agent.call("test.sleep", params, call_id="doomed")
    eventually(Job.objects.filter(session_id=lane_agent.session_id, call_id="doomed").exists)
    time.sleep(0.2)
    cancel = lane_agent.cancel("doomed")
    assert lane_agent.reply_to(cancel, "capabilities/cancel-result")["payload"]["cancelled"]
    assert lane_agent.result_of(call)["payload"]["error"]["code"] == ErrorCode.CANCELLED
    job = eventually(
        lambda: Job.objects.filter(
            pk=job_of(lane_agent, "doomed").pk, stopped_at__isnull=False
        ).first()
    )
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    # Killed, not left to the lane's time limit (1.5 s in the tests).
    assert seconds_between(job.settled_at, job.stopped_at) < 1.0
    again = lane_agent.call("test.sleep", {"steps": 0, "echo": 1}, call_id="after")
    assert lane_agent.result_of(again)["payload"]["data"]["echo"] == 1
    assert job_of(lane_agent, "after").queue == local_lane.LOCAL_QUEUE


def test_a_run_past_the_lanes_time_limit_is_killed_and_answered_timeout(
    lane_agent: Agent,
) -> None:
    params = {"mode": "block", "steps": 1, "stepMs": 30_000}
    call = lane_agent.call("test.sleep", params, call_id="slow", timeout_ms=60_000)
    payload = lane_agent.result_of(call)["payload"]
    assert payload["error"]["code"] == ErrorCode.TIMEOUT
    job = job_of(lane_agent, "slow")
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.TIMEOUT
    assert job.cancel_reason == "local lane time limit"
    assert job.stopped_at is not None


def test_a_session_timeout_stops_the_local_run(lane_agent: Agent) -> None:
    params = {"mode": "block", "steps": 1, "stepMs": 30_000}
    call = lane_agent.call("test.sleep", params, call_id="short", timeout_ms=300)
    assert lane_agent.result_of(call)["payload"]["error"]["code"] == ErrorCode.TIMEOUT
    job = eventually(
        lambda: Job.objects.filter(
            pk=job_of(lane_agent, "short").pk, stopped_at__isnull=False
        ).first()
    )
    assert job.cancel_reason == "options.timeout"


def test_a_run_out_of_memory_fails_alone(lane_agent: Agent) -> None:
    call = lane_agent.call("test.allocate", {"mb": 1024}, call_id="greedy")
    payload = lane_agent.result_of(call)["payload"]
    assert payload["error"]["code"] == ErrorCode.OPERATION_FAILED
    assert "memory" in payload["error"]["message"]
    again = lane_agent.call("test.sleep", {"steps": 0, "echo": 2})
    assert lane_agent.result_of(again)["payload"]["data"]["echo"] == 2


def test_a_crash_is_answered_and_its_traceback_kept(lane_agent: Agent) -> None:
    call = lane_agent.call("test.sleep", {"mode": "crash", "steps": 0}, call_id="crash")
    assert lane_agent.result_of(call)["payload"]["error"]["code"] == ErrorCode.OPERATION_FAILED
    assert "asked to crash" in job_of(lane_agent, "crash").error_traceback


def test_a_daphne_that_dies_mid_run_leaves_an_answer_for_a_resume(stack: Stack) -> None:
    port = free_port()
    web = stack.new_web(port, name="daphne-lane-doomed", env=LANE_ENV)
    web.start(lambda: port_open(port))
    try:
        with Agent(f"ws://127.0.0.1:{port}/abp/ws") as agent:
            agent.initialize()
            call_until_local(agent, "test.sleep", {"steps": 0})
            params = {"mode": "block", "steps": 1, "stepMs": 1_000}
            agent.call("test.sleep", params, call_id="orphan")
            eventually(Job.objects.filter(session_id=agent.session_id, call_id="orphan").exists)
            web.kill()
            # Its heartbeat stopped with Daphne: the reaper fails it 3 s later here.
            job = eventually(
                lambda: Job.objects.filter(
                    session_id=agent.session_id, call_id="orphan", status=JobStatus.FAILED
                ).first(),
                timeout=15,
            )
    finally:
        web.stop()
    assert job.error_code == ErrorCode.WORKER_LOST
    assert job.error_retryable is True


@pytest.mark.usefixtures("stack")
def test_the_lane_heartbeat_keeps_a_job_from_the_reaper_until_it_is_settled() -> None:
    # Daphne settles a finished run on its one database thread, which may be busy (a
    # replica taking many resumes at once): the lane's heartbeat thread keeps the job
    # alive meanwhile, and the stack's reaper fails it only once the beat stops.
    session = AgentSession.objects.create(agent_name="lane-heartbeat")
    job = Job.objects.create(
        session=session,
        call_id="beating",
        capability="convert.markdownToHtml",
        queue="local",
        worker="local@test:1",
        status=JobStatus.RUNNING,
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
    )
    lane = local_lane.LocalLane()
    lane.unsettled.add(str(job.pk))
    heartbeat = HeartbeatThread("test-lane-heartbeat", lane.beat)
    heartbeat.start()
    try:
        lost_after = abp_settings().WORKER_LOST_AFTER_SECONDS
        time.sleep(1.5 * lost_after + 0.5)
        job.refresh_from_db()
        assert job.status == JobStatus.RUNNING
        lane.unsettled.clear()
        failed = eventually(
            lambda: Job.objects.filter(pk=job.pk, status=JobStatus.FAILED).first(),
            timeout=lost_after + 10,
        )
        assert failed.error_code == ErrorCode.WORKER_LOST
    finally:
        # A beat left running would go on into later tests (which may not use the
        # database): its failures' tracebacks parse source as they print, and
        # CPython 3.11.7's parser state is not safe to share across threads.
        heartbeat.stop()
        heartbeat.join(timeout=10)


# -- the parts -------------------------------------------------------------------------


def test_a_run_answers_data_or_a_coded_error() -> None:
    child.prepare(0, ["convert.markdownToHtml"])
    ran = child.run("convert.markdownToHtml", SMALL)
    assert ran.data is not None
    assert ran.data["html"].startswith("<h1>")
    refused = child.run("convert.markdownToHtml", {"markdown": NESTED_TOO_DEEPLY})
    assert refused.error is not None
    assert refused.error.code == ErrorCode.INVALID_PARAMS
    unknown = child.run("no.such", {}).error
    assert unknown is not None
    assert unknown.code == ErrorCode.UNKNOWN_CAPABILITY
    crashed = child.run("test.sleep", {"mode": "crash", "steps": 0})
    assert crashed.error is not None
    assert crashed.error.code == ErrorCode.OPERATION_FAILED
    assert crashed.crashed
    assert "asked to crash" in crashed.traceback
    with pytest.raises(Exception, match="cannot run in the local lane"):
        child.NoJob().save_file(b"", mime_type="x/y", filename="f")


def test_pool_failures_are_a_timeout_or_a_lost_process() -> None:
    timeout = local_lane._outcome("job", pool.Failure.TIME_LIMIT)
    assert (timeout.status, timeout.cancel_source) == (JobStatus.CANCELLED, CancelSource.TIMEOUT)
    assert timeout.error is not None
    assert timeout.error.code == ErrorCode.TIMEOUT
    assert timeout.cancel_reason == "local lane time limit"
    lost = local_lane._outcome("job", pool.Failure.PROCESS_LOST)
    assert lost.error is not None
    assert (lost.status, lost.error.code, lost.error.retryable) == (
        JobStatus.FAILED,
        ErrorCode.WORKER_LOST,
        True,
    )


def test_the_lane_takes_only_its_capabilities_small_params_and_while_it_has_room() -> None:
    lane = local_lane.LocalLane()
    assert not lane.takes("convert.markdownToHtml", SMALL)  # not started
    lane._life.on(LaneEvent.START)  # its processes starting: runs wait for them
    assert lane.takes("convert.markdownToHtml", SMALL)
    assert not lane.takes("export.pdf", {"html": "x"})
    big = {"markdown": "x" * (abp_settings().LOCAL_LANE_MAX_PARAMS_BYTES + 1)}
    assert not lane.takes("convert.markdownToHtml", big)
    abp = abp_settings()
    room = abp.LOCAL_LANE_PROCESSES * (1 + abp.LOCAL_LANE_BACKLOG)
    # Each place is held from the start's check (before its row is written) to the
    # run's end: a burst of starts in one database hop cannot overfill the backlog.
    for _ in range(room - 1):  # running, waiting for a process, or being written
        assert lane.takes("convert.markdownToHtml", SMALL)
    assert not lane.takes("convert.markdownToHtml", SMALL)
    lane.give_back()  # a run ended, or a start went elsewhere
    assert lane.takes("convert.markdownToHtml", SMALL)
    assert not lane.takes("convert.markdownToHtml", SMALL)
    assert os.getpid() == int(lane.name.rsplit(":", 1)[1])


def test_a_lane_closed_before_it_started_never_starts() -> None:
    # Daphne stopped before the warm-up's thread started the lane: that start comes
    # after the close, and must start no process.
    lane = local_lane.LocalLane()
    assert abp_settings().LOCAL_LANE_PROCESSES > 0
    lane.close()
    lane.start()
    assert lane.state is LaneState.STOPPED
    assert lane._pool is None
    assert lane.warm(timeout=0)  # nothing to wait for
    assert not lane.takes("convert.markdownToHtml", SMALL)


def test_a_cancel_from_another_process_kills_the_local_run(lane_agent: Agent) -> None:
    # The operator's cancel, as the admin makes it: here, in the test process, not in
    # the Daphne running the call. Only the abort flag reaches the lane.
    params = {"mode": "block", "steps": 1, "stepMs": 60_000}
    call = lane_agent.call("test.sleep", params, call_id="operator")
    job = eventually(Job.objects.filter(session_id=lane_agent.session_id, call_id="operator").first)
    assert job.queue == local_lane.LOCAL_QUEUE
    assert cancellation.cancel(job.id, source=CancelSource.OPERATOR)
    assert lane_agent.result_of(call)["payload"]["error"]["code"] == ErrorCode.CANCELLED
    stopped = eventually(lambda: Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first())
    assert seconds_between(stopped.settled_at, stopped.stopped_at) < 1.0
