"""The local lane's processes (capabilities/lane/pool.py), real ones, without Daphne.

What matters is that no kill wedges the pool: a process killed while idle (a cancel
racing its run's end) held the shared task pipe's lock in billiard's Pool, and no
process ran a task again.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from capabilities.lane.pool import Failure, LanePool
from capabilities.lane.states import LaneState
from capabilities.work import runs

# Real processes, forked and killed: the stack lane's.
pytestmark = pytest.mark.stack

SLEEP = "test.sleep"
QUICK = {"steps": 0}
BLOCK = {"mode": "block", "steps": 1, "stepMs": 60_000}


@pytest.fixture
def pool() -> Iterator[LanePool]:
    lane = LanePool(2, 512, [SLEEP])
    try:
        assert lane.wait_ready(60)
        yield lane
    finally:
        lane.close()


class Ends:
    """The ends the pool reports, by job id."""

    def __init__(self) -> None:
        self._ends: queue.SimpleQueue[tuple[str, runs.Ran | Failure]] = queue.SimpleQueue()

    def submit(
        self, pool: LanePool, job_id: str, params: dict[str, Any], seconds: float = 30
    ) -> None:
        pool.submit(job_id, SLEEP, params, seconds, lambda end: self._ends.put((job_id, end)))

    def next(self, timeout: float = 30) -> tuple[str, runs.Ran | Failure]:
        return self._ends.get(timeout=timeout)

    def none_within(self, seconds: float) -> bool:
        try:
            self._ends.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


def running_pid(pool: LanePool, job_id: str) -> int:
    """The pid of the process running the job, once one runs it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for slot in pool._slots:
            with slot.lock:
                if slot.task is not None and slot.task.job_id == job_id and slot.process:
                    assert slot.process.pid is not None
                    return slot.process.pid
        time.sleep(0.02)
    raise AssertionError(f"no process runs {job_id}")


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_run_answers_what_its_process_returned(pool: LanePool) -> None:
    ends = Ends()
    ends.submit(pool, "a", QUICK)
    job_id, end = ends.next()
    assert job_id == "a"
    assert isinstance(end, runs.Ran)
    assert end.data is not None
    assert end.error is None


def test_processes_killed_while_idle_wedge_nothing(pool: LanePool) -> None:
    # Each process in turn is killed while idle, as a stale cancel would: billiard's
    # Pool then never ran a task again (the lock of its shared pipe died with it).
    ends = Ends()
    for round_ in range(3):
        for pid in pool.pids():
            os.kill(pid, signal.SIGKILL)
        for n in range(4):
            ends.submit(pool, f"{round_}-{n}", QUICK)
        got = {ends.next()[0] for _ in range(4)}
        assert got == {f"{round_}-{n}" for n in range(4)}


def test_a_stop_kills_only_the_process_running_its_job(pool: LanePool) -> None:
    ends = Ends()
    ends.submit(pool, "finished", QUICK)
    assert ends.next()[0] == "finished"
    before = set(pool.pids())
    assert not pool.stop("finished")  # its run has ended: no process is touched
    ends.submit(pool, "blocked", BLOCK)
    busy = running_pid(pool, "blocked")
    assert pool.stop("blocked")
    assert ends.none_within(1.0)  # a stopped run reports nothing: its stopper answers
    assert gone(busy)
    idle = before - {busy}
    assert idle <= set(pool.pids())  # the other process was left alone
    ends.submit(pool, "after", QUICK)
    assert ends.next()[0] == "after"


def test_a_stop_before_a_process_takes_the_run_drops_it(pool: LanePool) -> None:
    ends = Ends()
    ends.submit(pool, "one", BLOCK)
    ends.submit(pool, "two", BLOCK)
    running_pid(pool, "one")
    running_pid(pool, "two")
    ends.submit(pool, "waiting", QUICK)  # both processes are busy
    assert pool.stop("waiting")
    assert pool.stop("one")
    assert pool.stop("two")
    ends.submit(pool, "after", QUICK)
    assert ends.next()[0] == "after"  # "waiting" never ran, nor reported
    assert ends.none_within(0.5)


def test_a_run_past_its_time_is_killed_and_the_pool_goes_on(pool: LanePool) -> None:
    ends = Ends()
    ends.submit(pool, "slow", BLOCK, seconds=0.5)
    assert ends.next() == ("slow", Failure.TIME_LIMIT)
    ends.submit(pool, "after", QUICK)
    assert ends.next()[0] == "after"


def test_a_process_that_dies_mid_run_is_a_lost_process(pool: LanePool) -> None:
    ends = Ends()
    ends.submit(pool, "lost", BLOCK)
    os.kill(running_pid(pool, "lost"), signal.SIGKILL)
    assert ends.next() == ("lost", Failure.PROCESS_LOST)
    ends.submit(pool, "after", QUICK)
    assert ends.next()[0] == "after"


def test_close_ends_every_process_at_once() -> None:
    lane = LanePool(2, 512, [SLEEP])
    assert lane.wait_ready(60)
    Ends().submit(lane, "blocked", BLOCK)
    running_pid(lane, "blocked")
    pids = lane.pids()
    started = time.monotonic()
    lane.close()
    assert time.monotonic() - started < 10
    assert all(gone(pid) for pid in pids)


def test_a_process_starting_while_the_pool_closes_is_ended_with_it() -> None:
    # The race a stopped Daphne met: a slot restarting its process (killed while
    # idle, then given a run) as `close` went by, its process not in the slot yet.
    lane = LanePool(1, 512, [SLEEP])
    assert lane.wait_ready(60)
    [first] = lane.pids()
    started: list[Any] = []
    make_process = lane._context.Process

    def starts_once_closing(*args: Any, **kwargs: Any) -> Any:
        process = make_process(*args, **kwargs)

        def late_start() -> None:
            while lane.life.starts_processes():
                time.sleep(0.01)
            del process.start  # the class's own again, and nothing local to pickle
            process.start()
            started.append(process)

        setattr(process, "start", late_start)  # noqa: B010 - an instance's, for this test
        return process

    setattr(lane._context, "Process", starts_once_closing)  # noqa: B010
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone(first) and time.monotonic() < deadline:
        time.sleep(0.01)  # dead while idle, before the run comes
    ends = Ends()
    ends.submit(lane, "after-the-kill", BLOCK)
    time.sleep(0.2)  # the slot's thread takes the run, finds its process dead, restarts
    began = time.monotonic()
    lane.close()
    assert time.monotonic() - began < 5
    [late] = started
    assert late.pid is not None
    assert gone(late.pid)
    assert ends.none_within(0.5)  # dropped with the pool: the reaper answers its job


def test_closing_releases_whoever_waits_for_the_lane_to_be_warm() -> None:
    # A Daphne stopped while its lane warmed up could not exit: the warm-up's executor
    # thread waited (up to a minute), and the interpreter joins those at exit.
    lane = LanePool(1, 512, [SLEEP])
    waited: queue.SimpleQueue[tuple[bool, float]] = queue.SimpleQueue()

    def wait() -> None:
        began = time.monotonic()
        waited.put((lane.wait_ready(60), time.monotonic() - began))

    threading.Thread(target=wait, daemon=True).start()
    lane.close()
    ready, took = waited.get(timeout=10)
    assert ready is False
    assert took < 10


def never_ready(conn: Any, *_: Any) -> None:
    """A lane process that never says it has loaded its runners (a slow start-up)."""
    conn.recv()


class Starts:
    """Every process the pool creates from now on (the pool's own, unchanged unless
    `target` is given)."""

    def __init__(self, lane: LanePool, target: Any = None) -> None:
        self.made: list[Any] = []
        make_process = lane._context.Process

        def making(*args: Any, **kwargs: Any) -> Any:
            if target is not None:
                kwargs["target"] = target
            process = make_process(*args, **kwargs)
            self.made.append(process)
            return process

        setattr(lane._context, "Process", making)  # noqa: B010 - this pool's, for this test


def assert_ended_for_good(lane: LanePool, pids: list[int], starts: Starts) -> None:
    """No process the pool had is alive, and none can start: its threads are gone."""
    assert lane.life.state is LaneState.STOPPED
    assert [pid for pid in pids if not gone(pid)] == []
    assert lane.pids() == []
    assert not any(thread.is_alive() for thread in lane._threads)
    made = len(starts.made)
    Ends().submit(lane, "after-the-close", QUICK)
    assert not any(thread.is_alive() for thread in lane._threads)
    assert len(starts.made) == made


def test_a_close_while_every_process_is_busy_ends_them_all_for_good() -> None:
    lane = LanePool(2, 512, [SLEEP])
    assert lane.wait_ready(60)
    assert lane.life.state is LaneState.RUNNING
    ends = Ends()
    ends.submit(lane, "one", BLOCK)
    ends.submit(lane, "two", BLOCK)
    busy = [running_pid(lane, "one"), running_pid(lane, "two")]
    starts = Starts(lane)
    lane.close()
    assert_ended_for_good(lane, busy, starts)
    assert starts.made == []  # the processes it killed were not started again
    assert ends.none_within(0.5)  # dropped with the pool: the reaper answers their jobs
    assert lane.wait_ready(1) is False


def test_a_close_while_a_process_restarts_ends_its_replacement_before_it_is_up() -> None:
    lane = LanePool(1, 512, [SLEEP])
    assert lane.wait_ready(60)
    [first] = lane.pids()
    starts = Starts(lane, target=never_ready)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone(first) and time.monotonic() < deadline:
        time.sleep(0.01)  # dead while idle, before the run comes
    ends = Ends()
    ends.submit(lane, "after-the-kill", QUICK)  # its slot finds it dead and restarts it
    deadline = time.monotonic() + 10
    while not [pid for pid in lane.pids() if pid != first] and time.monotonic() < deadline:
        time.sleep(0.01)
    [replacement] = starts.made
    assert replacement.pid in lane.pids()
    assert not lane._slots[0].ready.is_set()  # started, not yet up
    lane.close()
    assert_ended_for_good(lane, [first, replacement.pid], starts)
    assert len(starts.made) == 1
    assert ends.none_within(0.5)
