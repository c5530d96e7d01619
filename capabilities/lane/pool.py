"""The local lane's processes: each with a pipe of its own, so that a kill wedges nothing.

billiard's Pool (like multiprocessing's) hands tasks to its processes through one
shared pipe, and the idle process waiting on it holds the pipe's lock. A process
killed while idle (a cancel racing its run's end) keeps that lock forever: no
process takes a task again, and the pool's own shutdown waits on it too. Celery's
AsynPool gives each process pipes of its own for this reason, but it needs kombu's
event loop. Here each process is kept by a thread of its own in Daphne, which hands
it one run at a time and starts another process when it dies (docs/design.md), as
long as the lane's lifecycle (lane/states.py) says it starts processes.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from capabilities.lane import child
from capabilities.lane.states import LaneEvent, LaneLifecycle
from capabilities.work import runs

logger = logging.getLogger(__name__)

# A process that dies before it is ready (its start-up failed) is started again after
# this pause, so that a broken start-up does not spin.
RESTART_PAUSE_SECONDS = 1.0
# How long a closing pool lets its processes end on SIGTERM before it SIGKILLs them.
STOP_GRACE_SECONDS = 1.0
# How long `close` waits, at most, for a killed process to be reaped and a thread to end.
REAP_SECONDS = 5.0


class Failure(enum.Enum):
    """A run its process could not finish."""

    TIME_LIMIT = "time limit"
    PROCESS_LOST = "process lost"


Done = Callable[[runs.Ran | Failure], None]


@dataclass(kw_only=True, eq=False)
class _Task:
    job_id: str
    capability: str
    params: dict[str, Any]
    seconds: float
    done: Done
    user_id: int | None = None
    stopped: bool = False


@dataclass(eq=False)
class _Slot:
    """One process, and the task it runs (guarded by `lock`)."""

    number: int
    process: BaseProcess | None = None
    task: _Task | None = None
    killed: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LanePool:
    """`processes` processes from a fork server, each prepared with `child.prepare`.

    It starts the lane's `life` (a new one if none is given) and ends it in `close`.
    """

    def __init__(
        self,
        processes: int,
        memory_limit_mb: int,
        capabilities: list[str],
        life: LaneLifecycle | None = None,
    ) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._prepare_args = (memory_limit_mb, capabilities)
        self._waiting: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._tasks: dict[str, _Task] = {}  # by job id, from submit to done
        self._lock = threading.Lock()
        self.life = life or LaneLifecycle()
        self.life.on(LaneEvent.START)
        self._slots = [_Slot(number) for number in range(processes)]
        self._threads = [
            threading.Thread(target=self._keep, args=(slot,), name=f"abp-lane-{n}", daemon=True)
            for n, slot in enumerate(self._slots)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        job_id: str,
        capability: str,
        params: dict[str, Any],
        seconds: float,
        done: Done,
        *,
        user_id: int | None = None,
    ) -> None:
        """Run it in the next free process, for at most `seconds` from then; `done` gets its end.

        `done` is called once, from a pool thread, unless the run is stopped first.
        `user_id`: the user it runs for, loaded there as `ctx.user`.
        """
        task = _Task(
            job_id=job_id,
            capability=capability,
            params=params,
            seconds=seconds,
            done=done,
            user_id=user_id,
        )
        with self._lock:
            self._tasks[job_id] = task
        self._waiting.put(task)

    def stop(self, job_id: str) -> bool:
        """Drop the job's run, waiting or running (its process is killed); False if none.

        Only a process still running this job is killed: one whose run has ended is
        never touched, whatever it does next.
        """
        with self._lock:
            task = self._tasks.pop(job_id, None)
        if task is None:
            return False
        task.stopped = True
        for slot in self._slots:
            with slot.lock:
                if slot.task is task and slot.process is not None:
                    slot.killed = True
                    _kill(slot.process)
        return True

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every process has prepared its runners (blocking); False if not in
        time, or if the pool closed meanwhile."""
        deadline = time.monotonic() + timeout
        ready = all(slot.ready.wait(max(deadline - time.monotonic(), 0)) for slot in self._slots)
        return ready and not self._closing()

    def pids(self) -> list[int]:
        """The processes' pids (those started)."""
        return [slot.process.pid for slot in self._slots if slot.process and slot.process.pid]

    def close(self) -> None:
        """End the pool for good (blocking, briefly): when it returns, every process it
        started has ended and none starts after.

        Each process gets SIGTERM, then SIGKILL if it is still there after
        STOP_GRACE_SECONDS. Runs not finished are dropped without their `done`: the
        process is going away, and the jobs' heartbeats with it (the reaper answers
        them, as WORKER_LOST). Whoever waits for the pool to be ready waits no more.
        """
        if not self.life.on(LaneEvent.CLOSE):
            # Closed already (or closing, in another thread): its end is this one's.
            self.life.wait_stopped(STOP_GRACE_SECONDS + 2 * REAP_SECONDS)
            return
        with self._lock:
            for task in self._tasks.values():
                task.stopped = True
            self._tasks.clear()
        for slot in self._slots:
            self._waiting.put(None)
            # Whoever waits for the lane to be warm waits no more: an executor thread
            # still waiting would hold the process's exit (concurrent.futures joins them).
            slot.ready.set()
        # A process that starts from here on is ended by its own thread (`_start`
        # reads the state under the slot's lock, as this reads the slot).
        self._end_all(signal.SIGTERM, STOP_GRACE_SECONDS)
        self._end_all(signal.SIGKILL, REAP_SECONDS)
        for thread in self._threads:
            thread.join(timeout=REAP_SECONDS)
        self.life.on(LaneEvent.ENDED)

    def _end_all(self, signal_number: int, grace: float) -> None:
        """Send the signal to every process alive, and wait up to `grace` for them to end."""
        alive = []
        for slot in self._slots:
            with slot.lock:
                if slot.process is not None:
                    _kill(slot.process, signal_number)
                    alive.append(slot.process)
        # Their sentinels, not `join`: the slots' threads join them too.
        sentinels = [process.sentinel for process in alive if process.pid]
        deadline = time.monotonic() + grace
        while sentinels and time.monotonic() < deadline:
            ended = wait(sentinels, deadline - time.monotonic())
            sentinels = [sentinel for sentinel in sentinels if sentinel not in ended]

    def _closing(self) -> bool:
        return not self.life.starts_processes()

    # -- one slot's thread ---------------------------------------------------------------

    def _keep(self, slot: _Slot) -> None:
        """Keep the slot's process and run tasks in it, one at a time, until closed."""
        conn: Connection | None = None
        while not self._closing():
            if conn is None:
                conn = self._start(slot)
                if conn is None:
                    if not self._closing():
                        time.sleep(RESTART_PAUSE_SECONDS)
                    continue
            task = self._waiting.get()
            if task is None:
                break
            if conn.poll(0):  # it died while idle (a process sends nothing unasked)
                self._end(slot, conn)
                conn = self._start(slot)
                if conn is None:
                    self._finish(task, Failure.PROCESS_LOST)
                    continue
            with slot.lock:
                # A stop that came before this found no process to kill: it is seen here.
                taken = not task.stopped
                if taken:
                    slot.task = task
            if not taken:
                continue
            ended = self._run(conn, task)
            with slot.lock:
                slot.task = None
                killed, slot.killed = slot.killed, False
            if killed or isinstance(ended, Failure):
                self._end(slot, conn)
                conn = None
            self._finish(task, ended)
        if conn is not None:
            self._end(slot, conn)

    def _start(self, slot: _Slot) -> Connection | None:
        """A new process for the slot, once prepared; None if it died first, or the
        pool is closing (a closing pool starts no process)."""
        if self._closing():
            return None
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=child.serve,
            args=(theirs, *self._prepare_args),
            name=f"abp-lane-{slot.number}",
            daemon=True,
        )
        try:
            process.start()
        except Exception:
            logger.exception("Local lane: a process could not start")
            ours.close()
            return None
        finally:
            theirs.close()  # the child's end: ours sees its death as the end of the pipe
        with slot.lock:
            slot.process = process
            closing = self._closing()
        if closing:
            # `close` may have looked at this slot before the process was in it.
            self._end(slot, ours)
            return None
        try:
            ours.recv()  # prepared
        except (EOFError, OSError):
            if not self._closing():  # one that `close` ended is no error
                logger.error(
                    "Local lane: a process died while it started (exit code %s)",
                    process.exitcode,
                )
            self._end(slot, ours)
            return None
        slot.ready.set()
        if all(each.ready.is_set() for each in self._slots):
            self.life.on(LaneEvent.READY)
        return ours

    def _run(self, conn: Connection, task: _Task) -> runs.Ran | Failure:
        try:
            conn.send((task.capability, task.params, task.user_id))
            if not conn.poll(max(task.seconds, 0.001)):
                return Failure.TIME_LIMIT
            ran: runs.Ran = conn.recv()
            return ran
        except (EOFError, OSError):
            return Failure.PROCESS_LOST

    def _end(self, slot: _Slot, conn: Connection) -> None:
        """Kill the slot's process and forget it (a new one starts with the next task)."""
        with slot.lock:
            process, slot.process = slot.process, None
            if not self._closing():  # a closed pool's waiters are released for good
                slot.ready.clear()
        conn.close()
        if process is not None:
            _kill(process)
            process.join(timeout=5)

    def _finish(self, task: _Task, ended: runs.Ran | Failure) -> None:
        with self._lock:
            mine = self._tasks.get(task.job_id) is task
            if mine:
                del self._tasks[task.job_id]
        if mine and not task.stopped:
            try:
                task.done(ended)
            except Exception:
                logger.exception("Local lane: the end of job %s was not handled", task.job_id)


def _kill(process: BaseProcess, signal_number: int = signal.SIGKILL) -> None:
    """Send it the signal (SIGKILL unless told), if it started and has not been reaped."""
    if process.pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal_number)
