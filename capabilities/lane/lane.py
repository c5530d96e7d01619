"""The local lane: small calls run beside Daphne, in a process pool of their own.

Through Celery a Markdown call of a few kilobytes spends far more on the way (the
broker, the worker's consumer, the prefork hand-off, the result's trip back) than
on the work. So calls of LOCAL_LANE_CAPABILITIES with small params, while a lane
process is free and their agent is within its share, skip Celery:

- their job row is written already running (worker `local@<host>:<pid>`, queue
  `local`): the row exists before the work starts, and the admin shows it;
- the run goes to the lane's processes (lane/pool.py), which come from a fork
  server, not from Daphne, each capped in memory and killed past
  LOCAL_LANE_TIME_LIMIT_SECONDS;
- when it ends, the call service settles it and answers it (calls/lane_runs.py).

A cancel settles first, as always, then raises the job's abort flag: the lane hears
it and kills the process running the job (the pool starts another). Until a run is
settled, the lane's heartbeat thread (jobs/heartbeat_thread.py) keeps its job's heartbeat fresh;
if Daphne itself dies, the heartbeat stops, and the reaper fails the job WORKER_LOST
once it is WORKER_LOST_AFTER_SECONDS old. The lane lives once (lane/states.py): closed,
it starts no process again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Any

from capabilities.conf import abp_settings
from capabilities.jobs import abort_listener, lifecycle
from capabilities.jobs.heartbeat_thread import HeartbeatThread
from capabilities.lane import pool
from capabilities.lane.pool import LanePool
from capabilities.lane.states import STARTS_PROCESSES, LaneEvent, LaneLifecycle, LaneState
from capabilities.models import CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import params_size, runs

logger = logging.getLogger(__name__)

LOCAL_QUEUE = "local"


class LocalLane:
    """This Daphne's pool, and the runs in it."""

    def __init__(self) -> None:
        self.name = f"local@{socket.gethostname()}:{os.getpid()}"
        self._life = LaneLifecycle()
        self._pool: LanePool | None = None
        self._start_lock = threading.Lock()
        self._runs: dict[str, asyncio.Future[lifecycle.Outcome | None]] = {}
        # Places taken, from a start's check to its run's end (or its start's failure):
        # a burst of starts in one database hop must not all count the runs as none.
        self._places = 0
        # Jobs written to run here and not settled yet (their run may be over): their
        # settle may wait behind Daphne's busy database thread, but not the heartbeat.
        self.unsettled: set[str] = set()
        self._heartbeat = HeartbeatThread("abp-lane-heartbeat", self.beat)

    @property
    def state(self) -> LaneState:
        """Where the lane is in its life (lane/states.py)."""
        return self._life.state

    def start(self) -> None:
        """Start the pool, if the lane is on and was never started nor closed (blocking:
        call it off the event loop)."""
        abp = abp_settings()
        processes = abp.LOCAL_LANE_PROCESSES
        with self._start_lock:
            if self.state is not LaneState.NOT_STARTED or processes <= 0:
                return
            self._pool = LanePool(
                processes,
                abp.LOCAL_LANE_MEMORY_LIMIT_MB,
                list(abp.LOCAL_LANE_CAPABILITIES),
                self._life,
            )
            self._heartbeat.start()
        logger.info("Local lane started: %s processes (%s)", processes, self.name)

    def close(self) -> None:
        """End the lane for good (blocking, briefly): every lane process has ended when
        it returns, and none starts after, even if `start` comes later. Runs not
        finished stop beating, and the reaper answers them as it would had Daphne died."""
        with self._start_lock:
            started = self._pool
            if started is None:
                self._life.on(LaneEvent.CLOSE)  # never started: it never will
                return
        self._heartbeat.stop()
        started.close()
        logger.info("Local lane stopped (%s)", self.name)

    def warm(self, timeout: float = 60.0) -> bool:
        """Wait until every process has loaded its runners (blocking); False if not in
        time, or if the lane closed meanwhile."""
        return self._pool is None or self._pool.wait_ready(timeout)

    def beat(self) -> None:
        """Write the heartbeat of the jobs not settled yet (one statement)."""
        job_ids = list(self.unsettled)
        if job_ids:
            lifecycle.heartbeat_all(job_ids)

    def takes(self, capability: str, params: dict[str, Any]) -> bool:
        """Whether this call may run here (its capability, its size, room); if so, its place.

        A place taken is given back by `give_back`: when its run ends, or when its
        start does not run it here after all.
        """
        abp = abp_settings()
        processes = abp.LOCAL_LANE_PROCESSES
        taken = (
            self.state in STARTS_PROCESSES
            and capability in abp.LOCAL_LANE_CAPABILITIES
            and self._places < processes * (1 + abp.LOCAL_LANE_BACKLOG)
            and params_size.json_fits(params, abp.LOCAL_LANE_MAX_PARAMS_BYTES)
        )
        self._places += taken
        return taken

    def give_back(self) -> None:
        """A place taken by `takes` is free again."""
        self._places = max(self._places - 1, 0)

    def runs(self, job: Job) -> bool:
        """Whether the job was written to run in this lane."""
        return job.status == JobStatus.RUNNING and job.worker == self.name

    def run(
        self,
        job_id: str,
        capability: str,
        params: dict[str, Any],
        seconds: float,
        user_id: int | None = None,
    ) -> asyncio.Future[lifecycle.Outcome | None]:
        """Hand the run to the pool (from the event loop); its outcome, None if stopped."""
        assert self._pool is not None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[lifecycle.Outcome | None] = loop.create_future()
        self._runs[job_id] = future
        future.add_done_callback(lambda _: self._runs.pop(job_id, None))

        def done(ended: runs.Ran | pool.Failure) -> None:
            loop.call_soon_threadsafe(_resolve, future, _outcome(job_id, ended))

        self._pool.submit(job_id, capability, params, seconds, done, user_id=user_id)
        return future

    def running(self) -> list[str]:
        """The jobs running in this lane."""
        return list(self._runs)

    def stop(self, job_id: str) -> bool:
        """Stop the job's run if it is in this lane (from any thread); False if not."""
        future = self._runs.get(job_id)
        if future is None or self._pool is None:
            return False
        self._pool.stop(job_id)
        future.get_loop().call_soon_threadsafe(_resolve, future, None)
        return True


_lane = LocalLane()


def current() -> LocalLane:
    """This process's lane."""
    return _lane


_starting: asyncio.Future[None] | None = None
_watching: asyncio.Task[None] | None = None


def start_soon() -> None:
    """Start the lane off the event loop, once (from it); calls go through Celery meanwhile.

    With it, its watcher of abort flags.
    """
    global _starting, _watching  # noqa: PLW0603 - one lane per process
    if _starting is None and abp_settings().LOCAL_LANE_PROCESSES > 0:
        _starting = asyncio.get_running_loop().run_in_executor(None, _lane.start)
        # Kill a run here when its job's abort flag goes up, whoever raised it,
        # wherever: the signal the workers hear, raised by every cancel that won.
        listener = abort_listener.AbortListener("local lane", _lane.running, _lane.stop)
        _watching = asyncio.create_task(abort_listener.listen(listener))


def _outcome(job_id: str, ended: runs.Ran | pool.Failure) -> lifecycle.Outcome:
    """The outcome of a run: what its process returned, or how the pool lost it."""
    if ended is pool.Failure.TIME_LIMIT:
        return lifecycle.Outcome.cancelled(CancelSource.TIMEOUT, "local lane time limit")
    if ended is pool.Failure.PROCESS_LOST:
        return lifecycle.Outcome.failed(
            WireError(
                code=ErrorCode.WORKER_LOST,
                message="The process running this call stopped unexpectedly; it can be retried.",
                retryable=True,
            )
        )
    if ended.crashed:
        logger.error("Job %s crashed in the local lane:\n%s", job_id, ended.traceback)
    return lifecycle.Outcome.of_run(ended)


def _resolve(
    future: asyncio.Future[lifecycle.Outcome | None], outcome: lifecycle.Outcome | None
) -> None:
    if not future.done():
        future.set_result(outcome)
