"""The local lane: small calls run beside Daphne, in a process pool of their own.

Through Celery a Markdown call of a few kilobytes spends far more on the way (the
broker, the worker's consumer, the prefork hand-off, the result's trip back) than
on the work. So calls of LOCAL_LANE_CAPABILITIES with small params, while a lane
process is free and their agent is within its share, skip Celery:

- their job row is written already running (worker `local@<host>:<pid>`, queue
  `local`): the row exists before the work starts, and the admin shows it;
- the run goes to the lane's processes (calls/lane_pool.py), which come from a fork
  server, not from Daphne, each capped in memory and killed past
  LOCAL_LANE_TIME_LIMIT_SECONDS;
- when it ends, one conditional UPDATE settles the job. If the connection that made
  the call still holds it, the same statement claims its delivery and that
  connection answers at once; otherwise the result goes to the session's group, as
  a worker's does.

A cancel settles first, as always, then raises the job's abort flag: the lane hears
it and kills the process running the job (the pool starts another). Until a run is
settled, the lane's heartbeat thread (jobs/heartbeats.py) keeps its job's heartbeat fresh;
if Daphne itself dies, the heartbeat stops, and the reaper fails the job WORKER_LOST
once it is WORKER_LOST_AFTER_SECONDS old.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async

from capabilities import tracing
from capabilities.calls import job_writes, lane_pool, params_size
from capabilities.calls.lane_pool import LanePool
from capabilities.conf import abp_settings
from capabilities.jobs import abort_listener, lifecycle, results
from capabilities.jobs.heartbeats import HeartbeatThread
from capabilities.models import CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import runs

logger = logging.getLogger(__name__)

LOCAL_QUEUE = "local"

# Settles a finished run and answers it, if this connection holds the call; False:
# it does not, and the session's group hears of the result instead.
Deliver = Callable[[Job, lifecycle.Outcome, dict[str, Any]], Awaitable[bool]]


class LocalLane:
    """This Daphne's pool, and the runs in it."""

    def __init__(self) -> None:
        self.name = f"local@{socket.gethostname()}:{os.getpid()}"
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

    def start(self) -> None:
        """Start the pool, if the lane is on (blocking: call it off the event loop)."""
        abp = abp_settings()
        processes = abp.LOCAL_LANE_PROCESSES
        with self._start_lock:
            if self._pool is not None or processes <= 0:
                return
            self._pool = LanePool(
                processes,
                abp.LOCAL_LANE_MEMORY_LIMIT_MB,
                list(abp.LOCAL_LANE_CAPABILITIES),
            )
            self._heartbeat.start()
        logger.info("Local lane started: %s processes (%s)", processes, self.name)

    def close(self) -> None:
        """End the lane with the process (blocking, briefly): every lane process is
        killed and none starts after. Runs not finished stop beating, and the reaper
        answers them as it would had Daphne died."""
        with self._start_lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        self._heartbeat.stop()
        pool.close()
        logger.info("Local lane stopped (%s)", self.name)

    def warm(self, timeout: float = 60.0) -> bool:
        """Wait until every process has loaded its runners (blocking); False if not in time."""
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
            self._pool is not None
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

        def done(ended: runs.Ran | lane_pool.Failure) -> None:
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


def lane() -> LocalLane:
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


_tasks: set[asyncio.Task[None]] = set()


def spawn(job: Job, params: dict[str, Any], deliver: Deliver | None) -> None:
    """Run a job written to run here, and settle it, in a task of its own.

    The run holds the place its start took (`LocalLane.takes`) until it ends.
    """
    task = asyncio.create_task(_run_job(job, params, deliver))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _run_job(job: Job, params: dict[str, Any], deliver: Deliver | None) -> None:
    _lane.unsettled.add(str(job.id))
    try:
        # The lane's own cap; the call's deadline cancels it as any call's does.
        seconds = abp_settings().LOCAL_LANE_TIME_LIMIT_SECONDS
        outcome = await _ran(job, params, seconds)
        if outcome is None:  # stopped: whoever stopped it settled it first
            await database_sync_to_async(lifecycle.record_stopped)(job.id)
            return
        response = results.outcome_response(job, outcome)
        if deliver is not None and await deliver(job, outcome, response):
            return
        await job_writes.settle(
            job_writes.LocalSettle(job=job, outcome=outcome, response=response, answered_here=False)
        )
    except Exception:
        # The row stays running; the reaper fails it WORKER_LOST, and its agent hears.
        logger.exception("Local run of job %s failed", job.id)
    finally:
        _lane.unsettled.discard(str(job.id))
        _lane.give_back()


async def _ran(job: Job, params: dict[str, Any], seconds: float) -> lifecycle.Outcome | None:
    """The lane's run of the job, under `abp.run` while traces are on."""
    if not tracing.enabled():
        return await _lane.run(str(job.id), job.capability, params, seconds, job.user_id)
    with tracing.span(
        "abp.run", job.trace_parent, job_id=job.id, capability=job.capability, worker=job.worker
    ):
        return await _lane.run(str(job.id), job.capability, params, seconds, job.user_id)


def _outcome(job_id: str, ended: runs.Ran | lane_pool.Failure) -> lifecycle.Outcome:
    """The outcome of a run: what its process returned, or how the pool lost it."""
    if ended is lane_pool.Failure.TIME_LIMIT:
        return lifecycle.Outcome.cancelled(CancelSource.TIMEOUT, "local lane time limit")
    if ended is lane_pool.Failure.PROCESS_LOST:
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
