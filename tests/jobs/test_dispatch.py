"""The dispatcher against the real database: who gets a free slot, and what is never sent.

Live workers come from Redis and jobs go to the broker: both seams are patched here
(a fixed set of workers, a list of what was sent). tests/stack/test_scheduling.py runs the
same rules on the real stack.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capabilities.endings import cancellation
from capabilities.jobs import dispatch, lifecycle, workers
from capabilities.models import AgentSession, CancelSource, Job, JobStatus

# A queue of these tests' own: the suite's real stack shares the database, and its
# reaper's pump would hand jobs on a queue its worker takes (abp.heavy) to that worker.
HEAVY = "abp.dispatch-tests"


class Broker:
    """What was handed to Celery, and the live workers the dispatcher sees."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.workers: list[workers.LiveWorker] = []

    def slots(self, queue: str, concurrency: int) -> None:
        self.workers = [
            workers.LiveWorker(
                hostname=f"w@{queue}",
                queues=(queue,),
                concurrency=concurrency,
                jobs=(),
                pid=1,
                announced_at=0.0,
            )
        ]


@pytest.fixture
def broker(database: None) -> Iterator[Broker]:
    found = Broker()

    def live_workers() -> list[workers.LiveWorker]:
        return found.workers

    def enqueue(job: Job) -> None:
        found.sent.append(str(job.id))

    with (
        mock.patch("capabilities.jobs.workers.live_workers", live_workers),
        mock.patch("capabilities.jobs.workers._seen", None),
        mock.patch("capabilities.jobs.queue.enqueue", enqueue),
        mock.patch("capabilities.jobs.queue.queue_for", return_value=HEAVY),
        mock.patch("capabilities.jobs.notes.notify"),
    ):
        # Jobs other tests left active would hold slots: each test starts clean.
        Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING)).update(
            status=JobStatus.CANCELLED
        )
        yield found


def new_session(principal: str) -> str:
    session = AgentSession.objects.create(principal=principal)
    return str(session.id)


def new_job(session_id: str, principal: str, *, share: int = 16, n: int = 0) -> Job:
    job = lifecycle.create_job(
        session_id=session_id,
        call_id=f"c-{uuid.uuid4().hex[:8]}-{n}",
        request_id="r",
        capability="test.sleep",
        params={},
        timeout_ms=60_000,
        progress_token=None,
        principal=principal,
        max_running=share,
    )
    # Strictly increasing creation times: the line's order does not hang on the clock.
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() + timedelta(microseconds=n))
    return job


def finish(job_id: str) -> None:
    lifecycle.settle(job_id, lifecycle.Outcome.succeeded({}), work_stopped=True)


def test_with_no_live_worker_nothing_is_sent(broker: Broker) -> None:
    job = new_job(new_session("key:a"), "key:a")
    assert broker.sent == []
    job.refresh_from_db()
    assert (job.status, job.dispatched_at, job.queue) == (JobStatus.QUEUED, None, HEAVY)


def test_a_worker_coming_up_takes_the_waiting_jobs_up_to_its_slots(broker: Broker) -> None:
    session = new_session("key:a")
    jobs = [new_job(session, "key:a", n=n) for n in range(3)]
    broker.slots(HEAVY, 2)
    sent = dispatch.pump()
    assert sent == [str(jobs[0].id), str(jobs[1].id)]
    assert dispatch.pump() == []  # every slot is taken


def test_a_second_agent_gets_the_next_free_slot_not_the_end_of_the_line(broker: Broker) -> None:
    broker.slots(HEAVY, 2)
    a_session, b_session = new_session("key:a"), new_session("key:b")
    a_jobs = [new_job(a_session, "key:a", n=n) for n in range(200)]
    b_job = new_job(b_session, "key:b", n=1000)
    assert broker.sent == [str(a_jobs[0].id), str(a_jobs[1].id)]

    finish(str(a_jobs[0].id))
    assert dispatch.pump() == [str(b_job.id)]
    finish(str(a_jobs[1].id))
    assert dispatch.pump() == [str(a_jobs[2].id)]


def test_an_agent_never_runs_more_than_its_share(broker: Broker) -> None:
    broker.slots(HEAVY, 4)
    session = new_session("key:small")
    jobs = [new_job(session, "key:small", share=1, n=n) for n in range(3)]
    assert broker.sent == [str(jobs[0].id)]
    assert dispatch.pump() == []
    finish(str(jobs[0].id))
    assert dispatch.pump() == [str(jobs[1].id)]


def test_a_job_cancelled_while_it_waits_is_never_sent(broker: Broker) -> None:
    session = new_session("key:a")
    waiting = new_job(session, "key:a")
    assert cancellation.settle_cancelled([str(waiting.id)], CancelSource.AGENT)[str(waiting.id)]
    broker.slots(HEAVY, 2)
    assert dispatch.pump() == []
    assert dispatch.claim(waiting.id) is False
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.CANCELLED
    assert waiting.stopped_at is not None  # it never started, so its work stopped then


def test_a_job_is_handed_over_once_whoever_pumps(broker: Broker) -> None:
    job = new_job(new_session("key:a"), "key:a")
    assert dispatch.claim(job.id) is True
    assert dispatch.claim(job.id) is False


def test_a_job_handed_over_and_never_started_is_handed_over_again(broker: Broker) -> None:
    broker.slots(HEAVY, 1)
    job = new_job(new_session("key:a"), "key:a")
    assert broker.sent == [str(job.id)]
    long_ago = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk=job.pk).update(dispatched_at=long_ago)
    assert dispatch.redispatch_stale() == 1
    assert dispatch.pump() == [str(job.id)]


def test_the_place_in_line_counts_the_agents_own_waiting_jobs(broker: Broker) -> None:
    session = new_session("key:a")
    jobs = [new_job(session, "key:a", n=n) for n in range(3)]
    assert [dispatch.position(job) for job in jobs] == [1, 2, 3]
    other = new_job(new_session("key:b"), "key:b", n=10)
    assert dispatch.position(other) == 1
