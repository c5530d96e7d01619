"""Every settler of a job racing at once: exactly one outcome wins, on either database.

Each job is raced by the product's own entry points, each in a thread of its own with
its own database connection, released together: the agent's cancel (the consumer's
`settle_cancelled`, then `stop_work`), an operator's cancel (the admin's
`cancellation.cancel`), a timeout (the reaper's `end_overdue`), the worker
(`executor.execute`: start the job, run `test.sleep`, settle its success) and a lost
worker (`cancellation.fail_lost`, as the reaper and Celery's task_failure call it).

Redis and Celery are replaced by recorders, so the test also sees that only the
winner raises the abort flag, revokes the task or tells the session, and a spy on
`settle` sees every settle's answer. `make test` runs this on SQLite, `make
test-postgres` on PostgreSQL.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from capabilities.endings import cancellation
from capabilities.jobs import abort_flags, dispatch, lifecycle, notes, queue
from capabilities.models import SETTLED_STATUSES, AgentSession, CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode
from capabilities.worker import executor, reaper
from capabilities.worker.interrupter import Interrupter

pytestmark = pytest.mark.usefixtures("database")

KINDS = ("agent", "operator", "timeout", "worker", "lost")
CANCELS = {"agent", "operator", "timeout"}
JOBS = 160
# Jobs raced at once: five connections each, well within PostgreSQL's default 100.
JOBS_PER_ROUND = 4
WORKER_NAME = "race-worker"


@dataclass
class Recorder:
    """What the racers did outside the database, and every settle's answer."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    flags: Counter[str] = field(default_factory=Counter)
    revokes: Counter[str] = field(default_factory=Counter)
    settled_notes: Counter[str] = field(default_factory=Counter)
    settles: list[tuple[str, str, bool]] = field(default_factory=list)
    returns: dict[tuple[str, str], bool | None] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)


class PerThreadInterrupter:
    """One Interrupter per thread: each worker thread here stands for a worker process."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        if not hasattr(self._local, "interrupter"):
            self._local.interrupter = Interrupter()
        return getattr(self._local.interrupter, name)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Redis and Celery replaced by recorders; `settle` spied on."""
    seen = Recorder()
    real_settle = lifecycle.settle

    def settle(job_id: uuid.UUID | str, outcome: lifecycle.Outcome, **kwargs: Any) -> bool:
        won = real_settle(job_id, outcome, **kwargs)
        with seen.lock:
            # The thread's name says which racer it is.
            seen.settles.append((str(job_id), threading.current_thread().name, won))
        return won

    def raise_flag(job_id: str) -> None:
        with seen.lock:
            seen.flags[str(job_id)] += 1

    def is_raised(job_id: str) -> bool:
        with seen.lock:
            return seen.flags[str(job_id)] > 0

    def revoke(job_id: str, *, kill: bool = False) -> None:
        with seen.lock:
            seen.revokes[str(job_id)] += 1

    def notify(session_id: str, note: notes.Note) -> bool:
        if note["type"] == "job.settled":
            with seen.lock:
                seen.settled_notes[str(session_id)] += 1
        return True

    monkeypatch.setattr(lifecycle, "settle", settle)
    monkeypatch.setattr(cancellation, "settle", settle)  # bound by name there
    monkeypatch.setattr(abort_flags, "raise_flag", raise_flag)
    monkeypatch.setattr(abort_flags, "is_raised", is_raised)
    monkeypatch.setattr(queue, "revoke", revoke)
    monkeypatch.setattr(notes, "notify", notify)
    monkeypatch.setattr(dispatch, "pump_safely", lambda queues=None: None)
    monkeypatch.setattr(executor, "INTERRUPTER", PerThreadInterrupter())
    return seen


def agent_cancel(job_id: str) -> bool | None:
    """What the consumer does for capabilities/cancel (transport/session_io.py)."""
    won = cancellation.settle_cancelled([job_id], CancelSource.AGENT, "race", delivered=True)
    if won[job_id]:
        cancellation.stop_work(job_id)
    return won[job_id]


def operator_cancel(job_id: str) -> bool | None:
    """What the admin's cancel action does."""
    return cancellation.cancel(job_id, source=CancelSource.OPERATOR, reason="race")


def timeout(job_id: str) -> bool | None:
    """What the reaper does with an overdue job."""
    reaper.end_overdue(job_id)
    return None


def worker(job_id: str) -> bool | None:
    """What the Celery task does: start the job, run it, settle its success."""
    executor.execute(job_id, worker_name=WORKER_NAME)
    return None


def lost_worker(job_id: str) -> bool | None:
    """What the reaper and Celery's task_failure do for a dead worker."""
    return cancellation.fail_lost(job_id)


RACERS: dict[str, Callable[[str], bool | None]] = {
    "agent": agent_cancel,
    "operator": operator_cancel,
    "timeout": timeout,
    "worker": worker,
    "lost": lost_worker,
}


def new_jobs(count: int, start: int) -> list[Job]:
    """Queued jobs handed to Celery, each in its own session.

    Far from their deadline and their sessions seen in the future, so a stack's
    reaper running on the same database (the `stack` fixture) leaves them alone.
    """
    now = timezone.now()
    jobs = []
    for number in range(start, start + count):
        session = AgentSession.objects.create(
            agent_name="settle race", seen_at=now + timedelta(days=1)
        )
        jobs.append(
            Job.objects.create(
                session=session,
                call_id=f"race-{number}",
                capability="test.sleep",
                params={"steps": 0, "echo": number},
                queue="abp.heavy",
                dispatched_at=now,
                deadline=now + timedelta(days=1),
            )
        )
    return jobs


def race(jobs: list[Job], seen: Recorder, rng: random.Random, first: int) -> None:
    """Release every racer of every job at once; each job's `first` kind goes first.

    The others start up to 2 ms later, so that each kind wins some of the jobs.
    """
    threads = []
    barrier = threading.Barrier(len(jobs) * len(KINDS))
    for offset, job in enumerate(jobs):
        head_start = KINDS[(first + offset) % len(KINDS)]
        for kind in KINDS:
            delay = 0.0 if kind == head_start else rng.uniform(0, 0.002)
            threads.append(
                threading.Thread(
                    target=run_racer,
                    args=(kind, str(job.id), barrier, delay, seen),
                    name=kind,
                )
            )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_racer(
    kind: str, job_id: str, barrier: threading.Barrier, delay: float, seen: Recorder
) -> None:
    try:
        barrier.wait()
        time.sleep(delay)
        returned = RACERS[kind](job_id)
        with seen.lock:
            seen.returns[(job_id, kind)] = returned
    except BaseException as exc:  # reported by the test, not lost in the thread
        with seen.lock:
            seen.errors.append(exc)
    finally:
        connection.close()  # this thread's own connection


def rounds(count: int) -> Iterator[tuple[int, int]]:
    """(first job number, jobs) for each round."""
    for start in range(0, count, JOBS_PER_ROUND):
        yield start, min(JOBS_PER_ROUND, count - start)


def test_every_settler_at_once_one_outcome_wins(recorder: Recorder) -> None:
    rng = random.Random(20)
    jobs: list[Job] = []
    for start, count in rounds(JOBS):
        batch = new_jobs(count, start)
        race(batch, recorder, rng, first=start)
        jobs += batch
    assert recorder.errors == []

    winners: Counter[str] = Counter()
    for job in jobs:
        job_id = str(job.id)
        won = [kind for settled, kind, ok in recorder.settles if settled == job_id and ok]
        assert len(won) == 1, (job_id, won)
        winner = won[0]
        winners[winner] += 1
        # The racers that answer say the same.
        for kind in ("agent", "operator", "lost"):
            assert recorder.returns[(job_id, kind)] is (kind == winner), (job_id, kind, winner)
        check_row(Job.objects.get(pk=job.id), winner)
        # Only a cancel that won stops the work; only the agent's consumer answers its
        # agent itself, every other winner tells the session once.
        assert recorder.flags[job_id] == (1 if winner in CANCELS else 0), (job_id, winner)
        assert recorder.revokes[job_id] == (1 if winner in CANCELS else 0), (job_id, winner)
        told = recorder.settled_notes[str(job.session_id)]
        assert told == (0 if winner == "agent" else 1), (job_id, winner)
    # Not the point, but a race every job of which the same kind won would prove little.
    assert len(winners) >= 2, winners


def check_row(job: Job, winner: str) -> None:
    """The row holds the winner's outcome, and nothing of the losers'."""
    assert job.status in SETTLED_STATUSES
    assert job.settled_at is not None
    # However it ended, the job records that its work stopped.
    assert job.stopped_at is not None
    expected: dict[str, tuple[JobStatus, str, str]] = {
        "agent": (JobStatus.CANCELLED, CancelSource.AGENT, ErrorCode.CANCELLED),
        "operator": (JobStatus.CANCELLED, CancelSource.OPERATOR, ErrorCode.CANCELLED),
        "timeout": (JobStatus.CANCELLED, CancelSource.TIMEOUT, ErrorCode.TIMEOUT),
        "worker": (JobStatus.SUCCEEDED, "", ""),
        "lost": (JobStatus.FAILED, "", ErrorCode.WORKER_LOST),
    }
    assert (job.status, job.cancel_source, job.error_code) == expected[winner]
    assert (job.delivered_at is not None) is (winner == "agent")
    if winner == "worker":
        assert job.result == {"echo": int(job.call_id.removeprefix("race-")), "steps": 0}
        assert job.worker == WORKER_NAME
    else:
        assert job.result is None
