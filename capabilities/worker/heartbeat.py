"""Each worker process says, every few seconds, that the job it runs is still alive.

A heartbeat thread (capabilities/jobs/heartbeat_thread.py): it keeps beating while the
task's thread is deep in a render, so a worker killed by the kernel, an operator or
a crash still gets its agent an answer.

The same write carries the job's last progress report if the DB interval held it
back (a job that reported early, then went quiet), so the admin catches up.
"""

from __future__ import annotations

from capabilities.jobs import lifecycle
from capabilities.jobs.heartbeat_thread import HeartbeatThread
from capabilities.worker import executor
from capabilities.worker.interrupter import INTERRUPTER


def beat() -> None:
    """Write the heartbeat of the job this process runs, if any."""
    job_id = INTERRUPTER.current_job_id
    if job_id is not None:
        # A progress report held back by the DB interval goes with it.
        lifecycle.heartbeat(job_id, executor.take_unsaved_progress(job_id))


_heartbeat: HeartbeatThread | None = None


def start() -> HeartbeatThread:
    """Start this process's heartbeat once (in each worker child after fork)."""
    global _heartbeat  # noqa: PLW0603 - one per process
    if _heartbeat is None or not _heartbeat.is_alive():
        _heartbeat = HeartbeatThread("abp-heartbeat", beat)
        _heartbeat.start()
    return _heartbeat
