"""A Daphne told to stop (SIGTERM, as a rolling restart does) drains: no call is lost.

Its sessions are closed with 1012 (resume elsewhere) before anything is cancelled, and
each resumes on another Daphne with its call in flight answered once there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psutil  # type: ignore[import-untyped]

from capabilities.models import AgentSession, Job
from tests.stack.test_resume import call_results, dropped
from tests.support.agent import Agent
from tests.support.stack import ManagedProcess, Stack, free_port, port_open
from tests.support.waiting import eventually

STILL_RUNNING = {"steps": 500, "stepMs": 20}  # 10 s: most still run when the Daphne stops


def test_a_stopping_daphne_closes_its_sessions_with_1012_and_they_resume_elsewhere(
    stack: Stack,
) -> None:
    port = free_port()
    leaving = stack.new_web(port, name="daphne-draining")
    leaving.start(lambda: port_open(port))
    try:
        agents = [dropped(stack, f"ws://127.0.0.1:{port}/abp/ws") for _ in range(3)]
        calls = [
            agent.call("test.sleep", STILL_RUNNING, call_id=f"drained-{n}")
            for n, (agent, _, _) in enumerate(agents)
        ]
        # Each call's job exists (running, or queued behind the worker's other jobs).
        for n, (agent, _, _) in enumerate(agents):
            eventually(
                Job.objects.filter(session_id=agent.session_id, call_id=f"drained-{n}").first
            )
        stopped_at = time.monotonic()
        leaving.stop()
        stop_seconds = time.monotonic() - stopped_at
    finally:
        leaving.kill()
    codes = [agent.read_until_closed() for agent, _, _ in agents]
    assert codes == [1012, 1012, 1012], leaving.tail()
    assert "Stopping: 3 sessions told to resume elsewhere (1012)" in leaving.log_text()
    # Detached, not cancelled: each session waits for its resume.
    for _, session_id, _ in agents:
        assert AgentSession.objects.get(pk=session_id).detached_at is not None
    # Each resumed at once (the test stack's grace is 5 s), then answered there.
    resumed = [Agent(stack.ws_url) for _ in agents]
    for again, (_, session_id, token) in zip(resumed, agents, strict=True):
        assert "error" not in again.resume(session_id, token)["payload"]
    answered_after_resume = 0
    for n, (again, (first, _, _), call) in enumerate(zip(resumed, agents, calls, strict=True)):
        before = first.results_for_call(f"drained-{n}")  # answered before the stop
        if not before:
            again.result_of(call, timeout=60)
        after = call_results(again, f"drained-{n}")
        again.close()
        assert [answer["payload"]["success"] for answer in before + after] == [True]
        answered_after_resume += len(after)
    assert answered_after_resume > 0  # the calls in flight at the stop
    assert stop_seconds < 5, leaving.tail()


def test_a_key_that_cannot_be_checked_is_closed_with_1013_by_a_real_daphne(stack: Stack) -> None:
    # Autobahn refuses 1012 and 1013 from application code: before Daphne's close sent
    # them itself, this close raised, and the socket stayed open with nobody reading it.
    away = {"DATABASE_URL": "sqlite:////nonexistent/abp-test/db.sqlite3"}
    with stack.another_web("daphne-database-away", away) as where:
        agent = Agent(f"ws://{where}/abp/ws")
        try:
            assert agent.read_until_closed(timeout=10) == 1013
        finally:
            agent.close()


LANE = {
    # test.sleep runs in the lane too here, so that a run is in a lane process.
    "ABP_LOCAL_LANE_CAPABILITIES": "convert.markdownToHtml,test.sleep",
    "ABP_LOCAL_LANE_PROCESSES": "2",
}


def lane_processes(daphne_pid: int) -> list[psutil.Process]:
    """The Daphne's descendants that run lane work: the fork server's children."""
    found = []
    for child in psutil.Process(daphne_pid).children(recursive=True):
        try:
            if child.ppid() != daphne_pid:
                found.append(child)
        except psutil.NoSuchProcess:
            pass  # gone meanwhile (a lane process restarting)
    return found


@contextlib.contextmanager
def daphne_with_a_warm_lane(stack: Stack, name: str) -> Iterator[tuple[ManagedProcess, Agent]]:
    """A Daphne of its own whose two lane processes are up, and an agent on it."""
    port = free_port()
    leaving = stack.new_web(port, name=name, env=LANE)
    leaving.start(lambda: port_open(port))
    try:
        with Agent(f"ws://127.0.0.1:{port}/abp/ws") as agent:
            agent.initialize()
            agent.result_of(agent.call("convert.markdownToHtml", {"markdown": "# warm"}))
            eventually(lambda: len(lane_processes(leaving.pid)) >= 2)
            yield leaving, agent
    finally:
        leaving.kill()


def test_a_stopping_daphne_leaves_no_lane_process_behind_busy_or_restarting(
    stack: Stack,
) -> None:
    with daphne_with_a_warm_lane(stack, "daphne-lane-stop") as (leaving, agent):
        lanes = lane_processes(leaving.pid)
        # One process busy with a run; the other killed, so the lane restarts it
        # as the next call comes: the stop meets both.
        agent.call("test.sleep", {"steps": 100, "stepMs": 10}, call_id="busy")
        eventually(
            lambda: (
                Job.objects.filter(session_id=agent.session_id, call_id="busy")
                .exclude(started_at=None)
                .exists()
            )
        )
        idle = [process for process in lanes if process.is_running()][-1]
        with contextlib.suppress(psutil.NoSuchProcess):
            idle.kill()
        agent.call("convert.markdownToHtml", {"markdown": "# again"}, call_id="restart")
        seen = {process.pid for process in lane_processes(leaving.pid)} | {p.pid for p in lanes}
        leaving.stop()
    assert "Local lane stopped" in leaving.log_text(), leaving.tail()
    # Every lane process there was, busy, idle or just started, has ended.
    eventually(lambda: not [p for p in seen if psutil.pid_exists(p) and not _zombie(p)])


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_every_lane_process_has_ended_when_a_daphne_stopped_with_a_busy_lane_exits(
    stack: Stack,
) -> None:
    with daphne_with_a_warm_lane(stack, "daphne-lane-busy-stop") as (leaving, agent):
        # Both processes blocked in a long run each (the lane's time limit is longer).
        blocked = {"mode": "block", "steps": 1, "stepMs": 4_000}
        for n in range(2):
            agent.call("test.sleep", blocked, call_id=f"busy-{n}")
        eventually(
            lambda: (
                Job.objects.filter(session_id=agent.session_id, status="running")
                .exclude(started_at=None)
                .count()
                == 2
            )
        )
        seen = {process.pid for process in lane_processes(leaving.pid)}
        leaving.stop()
        exit_code = leaving.proc.returncode if leaving.proc else None
    assert "Local lane stopped" in leaving.log_text(), leaving.tail()
    assert exit_code is not None
    assert exit_code >= 0, leaving.tail()  # it exited, not killed after the timeout
    # Ended before Daphne exited: no wait here.
    assert [p for p in seen if psutil.pid_exists(p) and not _zombie(p)] == []
