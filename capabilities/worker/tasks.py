"""Celery tasks: thin interfaces that take an id and call the service that does the work."""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from billiard.exceptions import WorkerLostError
from billiard.pool import EX_RECYCLE
from celery import shared_task
from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.signals import (
    task_failure,
    task_prerun,
    task_revoked,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.db import close_old_connections, connections

from capabilities import tracing
from capabilities.endings import cancellation
from capabilities.jobs import lifecycle, queue, retention
from capabilities.work import registry
from capabilities.worker import executor, heartbeat, interrupter, memory_limit, presence, reaper

logger = logging.getLogger(__name__)

SWITCH_INTERVAL_SECONDS = 0.0005


@shared_task(name=queue.RUN_JOB, bind=True, ignore_result=True)
def run_job(self: Any, job_id: str) -> None:
    """Run one job (the task id is the job id)."""
    try:
        executor.execute(job_id, worker_name=f"{self.request.hostname}:{os.getpid()}")
    except MemoryError:
        # Out of memory outside the runner (a MemoryError reaching Celery's main
        # process is raised again there): the job is answered WORKER_LOST below.
        memory_limit.mark_exhausted()
        logger.warning("Job %s ran out of memory outside its runner", job_id)
    if memory_limit.exhausted():
        _leave_after_task(job_id)


def _leave_after_task(job_id: str) -> None:
    # A child that ran out of memory may have left C libraries halfway through
    # something: it takes no more jobs. A task that raises SystemExit is reported
    # to the main process first, then billiard ends the child (EX_RECYCLE: an
    # expected exit, not counted as a crash) and forks a fresh one. Celery reports
    # the task as WorkerLostError: `_on_failure` then tries `cancellation.fail_lost`, a no-op
    # for a job already settled, the answer for one that is not.
    logger.warning("Replacing worker process %s: job %s ran out of memory", os.getpid(), job_id)
    sys.exit(EX_RECYCLE)


@shared_task(name="abp.reap", ignore_result=True)
def reap() -> None:
    """End what nobody else ended: overdue jobs, workers that ignore a cancel."""
    reaper.reap()


@shared_task(name="abp.clean_up", ignore_result=True)
def clean_up() -> None:
    """Delete result files and job rows past their retention."""
    retention.clean_up()


@worker_init.connect
def _prepare_runners(sender: Any = None, **_: Any) -> None:
    # Before the pool forks: runners and their libraries load once, shared by every
    # child, and no job is cancelled halfway through an import.
    for spec in registry.all_specs():
        spec.prepare()
    # Everything loaded so far lives as long as the process: keep it out of the
    # garbage collector's full passes, which would scan it all and hold the GIL in
    # the middle of renders, delaying cancels (docs/benchmarks.md); forked children
    # also stop copying those pages by touching them.
    gc.collect()
    gc.freeze()
    if sender is not None and get_implementation(sender.pool_cls) is ThreadPool:
        _prepare_thread_pool(sender.concurrency)


def _prepare_thread_pool(concurrency: Any) -> None:
    # The thread pool runs jobs in this process and sends no worker_process_init
    # (prefork children and the solo pool do): this process is prepared as a child,
    # its memory ceiling included.
    # The Interrupter and the heartbeat follow one job per process: with more threads,
    # a cancel stops another job or none, and the other jobs' heartbeats go stale.
    if concurrency != 1:
        logger.error("The threads pool stops cancelled jobs only with -c 1, not -c %s", concurrency)
    _prepare_child()


# The worker announces itself while it can take jobs (availability, fair shares).
worker_ready.connect(presence.announce)
worker_shutdown.connect(presence.withdraw)


@worker_init.connect
def _check_connections_before_use(**_: Any) -> None:
    # Celery keeps a task's connection for the next (CELERY_DB_REUSE_MAX): one that a
    # PostgreSQL restart broke would fail every later task. Checked (one round trip)
    # before each task's first query instead, and replaced if the server dropped it.
    for database in connections.settings.values():
        database["CONN_HEALTH_CHECKS"] = True


@task_prerun.connect
def _fresh_connections(**_: Any) -> None:
    close_old_connections()


@worker_process_init.connect
def _prepare_child(**_: Any) -> None:
    # Each prefork child caps its own memory first (the main process, which forks
    # the replacements, is not capped), so the threads below count against it too.
    memory_limit.apply()
    # Each child listens for aborts of the job it runs. The watcher must get the
    # GIL from a busy render quickly: Python's default hand-over waits 5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    interrupter.start_watcher()
    heartbeat.start()
    # Off unless OTEL_* name a collector (docs/operating.md#traces). Per child: the
    # exporter's thread would not survive the fork.
    tracing.setup(tracing.WORKER_SERVICE, instrument_celery=True)


@worker_process_shutdown.connect
def _flush_spans(**_: Any) -> None:
    # A child leaves through os._exit, past atexit: the batched spans go now.
    tracing.shutdown()


@task_failure.connect
def _on_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    # Runs in the worker's main process when a child died under a task: the job's
    # agent is answered now rather than when its heartbeat goes stale.
    lost = getattr(sender, "name", None) == run_job.name and isinstance(exception, WorkerLostError)
    close_old_connections()  # the main process's own, perhaps idle since a restart
    if not lost or task_id is None:
        return
    if cancellation.fail_lost(task_id):
        logger.warning("Job %s lost with its worker process", task_id)
    else:
        # Settled already (cancelled, its work within the grace): the work stopped now.
        lifecycle.record_stopped(task_id)


@task_revoked.connect
def _on_revoked(
    request: Any = None, terminated: bool = False, expired: bool = False, **_: Any
) -> None:
    # Runs in the worker's main process.
    if request is None or getattr(request, "task", None) != run_job.name:
        return
    job_id = str(request.id)
    close_old_connections()
    if terminated:
        lifecycle.record_stopped(job_id, hard_killed=True)
        logger.warning("Job %s hard-killed after ignoring its cancel", job_id)
    elif expired:
        reaper.end_overdue(job_id)
