"""Batched hops (jobs/hop_batches.py) and the batched writes of calls (calls/job_writes.py).

In-process, on the run's database: what a batch writes must be what the same calls
written one at a time would have written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from functools import partial
from typing import Any

import kombu.exceptions
import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from capabilities.calls import availability, budgets, job_writes
from capabilities.calls.start_ticket import StartTicket
from capabilities.jobs import lifecycle, notes
from capabilities.jobs.hop_batches import HopBatch, run_each
from capabilities.jobs.lifecycle import CallIdInUse
from capabilities.models import AgentSession, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError
from tests.support.new_jobs import LANE, new_job, principal

pytestmark = pytest.mark.usefixtures("database")


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    # Availability is read from Redis; none runs here, and every queue has a worker.
    monkeypatch.setattr(availability, "unavailable", lambda capability: None)


@pytest.fixture
def session_id() -> str:
    found = str(uuid.uuid4())
    AgentSession.objects.create(id=found)
    return found


def slot_reads(queries: CaptureQueriesContext) -> int:
    return sum("COALESCE(SUM(" in query["sql"] for query in queries.captured_queries)


# -- the hop batch -------------------------------------------------------------------------


def test_what_comes_in_during_a_hop_goes_in_the_next_one_in_order() -> None:
    hops: list[list[int]] = []
    first_hop_in = threading.Event()
    go_on = threading.Event()

    def runner(items: Any) -> list[int | Exception]:
        hops.append(list(items))
        if len(hops) == 1:
            first_hop_in.set()
            assert go_on.wait(10)
        return run_each(items, lambda n: n * 10 if n != 3 else _raise(n))

    async def scenario() -> None:
        batch: HopBatch[int, int] = HopBatch(runner)
        first = batch.submit(0)
        await asyncio.to_thread(first_hop_in.wait, 10)
        later = [batch.submit(n) for n in range(1, 6)]
        go_on.set()
        assert await first == 0
        results = await asyncio.gather(*later, return_exceptions=True)
        assert results[:2] == [10, 20]
        assert isinstance(results[2], ValueError)  # its own exception, no one else's
        assert results[3:] == [40, 50]

    asyncio.run(scenario())
    assert hops == [[0], [1, 2, 3, 4, 5]]


def test_an_item_whose_waiter_gave_up_is_still_done() -> None:
    done: list[int] = []
    started = threading.Event()
    go_on = threading.Event()

    def runner(items: Any) -> list[int | Exception]:
        started.set()
        assert go_on.wait(10)
        done.extend(items)
        return list(items)

    async def scenario() -> None:
        batch: HopBatch[int, int] = HopBatch(runner)
        waiting = batch.submit(7)
        await asyncio.to_thread(started.wait, 10)
        waiting.cancel()
        go_on.set()
        assert await batch.submit(8) == 8

    asyncio.run(scenario())
    assert done == [7, 8]


def _raise(n: int) -> int:
    raise ValueError(n)


# -- new rows ------------------------------------------------------------------------------


def test_a_batch_of_starts_reads_the_slot_counts_once_and_writes_every_row(
    session_id: str,
) -> None:
    who = principal()
    items = [new_job(who, session_id, f"c-{n}") for n in range(5)]
    with CaptureQueriesContext(connection) as queries:
        written = job_writes._create_all(items)
    assert slot_reads(queries) == 1
    assert [job.call_id for job in written if isinstance(job, Job)] == [f"c-{n}" for n in range(5)]
    assert (
        Job.objects.filter(session_id=uuid.UUID(session_id), status=JobStatus.RUNNING).count() == 5
    )


def test_the_budget_holds_across_a_batch_as_it_does_one_call_at_a_time(session_id: str) -> None:
    who = principal(max_queued_calls=3)
    limit = who.max_calls_in_flight
    items = [new_job(who, session_id, f"c-{n}") for n in range(limit + 2)]
    written = job_writes._create_all(items)
    assert all(isinstance(job, Job) for job in written[:limit])
    refused = written[limit:]
    assert all(isinstance(error, budgets.OverBudget) for error in refused)
    assert Job.objects.filter(session_id=uuid.UUID(session_id)).count() == limit


def test_the_local_lane_takes_the_principals_share_and_the_rest_queue(
    session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No worker here: the rest wait for one (jobs/dispatch.py reads workers in Redis).
    monkeypatch.setattr("capabilities.jobs.dispatch.may_go_now", lambda *args: False)
    monkeypatch.setattr("capabilities.jobs.dispatch.created", lambda job: None)
    who = principal(max_concurrent_calls=2)
    written = job_writes._create_all([new_job(who, session_id, f"c-{n}") for n in range(4)])
    jobs = [job for job in written if isinstance(job, Job)]
    assert [(job.worker, job.status) for job in jobs] == [
        (LANE, JobStatus.RUNNING),
        (LANE, JobStatus.RUNNING),
        ("", JobStatus.QUEUED),
        ("", JobStatus.QUEUED),
    ]


def test_a_reused_call_id_fails_its_own_start_and_no_other(
    session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    monkeypatch.setattr("capabilities.jobs.dispatch.created", lambda job: sent.append(job.call_id))
    who = principal()
    items = [new_job(who, session_id, call_id) for call_id in ("a", "b", "a", "c")]
    written = job_writes._create_all(items)
    assert isinstance(written[2], CallIdInUse)
    assert [job.call_id for job in written if isinstance(job, Job)] == ["a", "b", "c"]
    assert sorted(
        Job.objects.filter(session_id=uuid.UUID(session_id)).values_list("call_id", flat=True)
    ) == [
        "a",
        "b",
        "c",
    ]


@pytest.mark.parametrize("count", [1, 3], ids=["alone", "batched"])
def test_a_start_whose_hand_over_fails_once_written_is_taken_not_refused(
    session_id: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    # The broker (or Redis) fails after the commit: the row stands, so refusing the
    # call would answer its agent twice (once now, once when the sweep sends it).
    def broker_down(job: Job) -> None:
        raise kombu.exceptions.OperationalError("Error 111 connecting to the broker")

    monkeypatch.setattr("capabilities.jobs.dispatch.may_go_now", lambda *args: True)
    monkeypatch.setattr("capabilities.jobs.dispatch.created", broker_down)
    who = principal()
    items = [new_job(who, session_id, f"c-{n}", run_by=None) for n in range(count)]
    written = job_writes._create_all(items)
    assert [job.call_id for job in written if isinstance(job, Job)] == [
        f"c-{n}" for n in range(count)
    ]
    handed_over = Job.objects.filter(session_id=uuid.UUID(session_id))
    assert handed_over.count() == count
    # Handed over and never started, they would hold the queue's slots in later tests.
    handed_over.delete()


# -- settles -------------------------------------------------------------------------------


def test_a_batch_of_settles_tells_the_session_only_once_committed(
    session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[tuple[str, bool]] = []

    def notify(session: str, note: dict[str, Any]) -> None:
        # Told inside the transaction, a connection could read the row before the settle.
        told.append((note["call_id"], connection.in_atomic_block))

    monkeypatch.setattr(notes, "notify", notify)
    who = principal()
    jobs = [job for job in job_writes._create_all([new_job(who, session_id, "x")])]
    jobs += job_writes._create_all([new_job(who, session_id, "y")])
    outcome = lifecycle.Outcome.succeeded({"html": "<h1>x</h1>"})
    settles = [
        job_writes.LocalSettle(job=job, outcome=outcome, response={}, answered_here=here)
        for job, here in zip(jobs, (False, True), strict=True)
        if isinstance(job, Job)
    ]
    assert job_writes._settle_all(settles) == [True, True]
    assert told == [("x", False)]  # the other was answered by its own connection
    assert job_writes._settle_all(settles[:1]) == [False]  # settled once


def test_a_doors_check_runs_alone_before_its_row_and_refuses_only_its_call(
    session_id: str,
) -> None:
    who = principal()
    seen: list[tuple[str, bool, bool]] = []

    def check(call_id: str, refuse: bool = False) -> None:
        # Outside the batch's transaction: a check may write (a session row reopened).
        written = Job.objects.filter(session_id=uuid.UUID(session_id), call_id=call_id).exists()
        seen.append((call_id, written, connection.in_atomic_block))
        if refuse:
            raise budgets.OverBudget(WireError(code=ErrorCode.RATE_LIMITED, message="full"))

    items = [
        dataclasses.replace(new_job(who, session_id, call_id), check=partial(check, call_id, bad))
        for call_id, bad in (("a", False), ("b", True), ("c", False))
    ]
    written = job_writes._create_all(items)
    assert seen == [("a", False, False), ("b", False, False), ("c", False, False)]
    assert isinstance(written[1], budgets.OverBudget)
    assert [job.call_id for job in written if isinstance(job, Job)] == ["a", "c"]


def test_a_call_whose_cancel_won_is_written_settled_though_no_worker_could_run_it(
    session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen with Redis down for a second: availability could not be read, the start
    # was refused, and the call answered `cancelled` had no row anywhere.
    unreadable = WireError(code=ErrorCode.INTERNAL_ERROR, message="Redis is down", retryable=True)
    monkeypatch.setattr(availability, "unavailable", lambda capability: unreadable)
    ticket = StartTicket()
    assert ticket.cancel("the agent's $/cancel_request")
    new = new_job(principal(), session_id, "cancelled-first", run_by=None)
    [written] = job_writes._create_all(
        [dataclasses.replace(new, job={**new.job, "ticket": ticket})]
    )
    assert isinstance(written, Job)
    row = Job.objects.get(session_id=uuid.UUID(session_id), call_id="cancelled-first")
    assert row.status == JobStatus.CANCELLED
    assert row.delivered_at is not None
    # Without the cancel, the same call is refused and nothing is stored.
    [refused] = job_writes._create_all([new_job(principal(), session_id, "no-cancel", run_by=None)])
    assert isinstance(refused, job_writes.Unavailable)
    assert not Job.objects.filter(call_id="no-cancel").exists()


def test_a_call_whose_cancel_won_takes_no_place_in_a_full_budget(session_id: str) -> None:
    who = principal(max_queued_calls=1)
    full = job_writes._create_all(
        [new_job(who, session_id, f"c-{n}") for n in range(who.max_calls_in_flight)]
    )
    assert all(isinstance(job, Job) for job in full)
    ticket = StartTicket()
    ticket.cancel("cancelled at once")
    new = new_job(who, session_id, "over-but-cancelled")
    [written] = job_writes._create_all(
        [dataclasses.replace(new, job={**new.job, "ticket": ticket})]
    )
    assert isinstance(written, Job)
    assert written.status == JobStatus.CANCELLED


@pytest.mark.parametrize(
    "outcome",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379"),
        WireError(code=ErrorCode.CAPABILITY_UNAVAILABLE, message="no worker", retryable=True),
    ],
    ids=["redis-unreadable", "no-worker"],
)
def test_a_cancel_that_wins_while_the_start_is_refused_still_gets_its_row(
    session_id: str, monkeypatch: pytest.MonkeyPatch, outcome: Exception | WireError
) -> None:
    # The soak's: the call's availability read met Redis down, its cancel won during
    # that read and was answered `cancelled`, and the failed start left no row.
    ticket = StartTicket()

    def read_while_the_cancel_wins(capability: str) -> WireError | None:
        assert ticket.cancel("the agent's cancel")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(availability, "unavailable", read_while_the_cancel_wins)
    new = new_job(principal(), session_id, "cancelled-meanwhile", run_by=None)
    [written] = job_writes._create_all(
        [dataclasses.replace(new, job={**new.job, "ticket": ticket})]
    )
    assert isinstance(written, Job)
    row = Job.objects.get(session_id=uuid.UUID(session_id), call_id="cancelled-meanwhile")
    assert row.status == JobStatus.CANCELLED
    assert row.delivered_at is not None


def test_a_refused_start_is_decided_and_a_later_cancel_finds_no_call(
    session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(capability: str) -> None:
        raise redis.ConnectionError("Error 111")

    monkeypatch.setattr(availability, "unavailable", unreadable)
    ticket = StartTicket()
    new = new_job(principal(), session_id, "refused", run_by=None)
    [refused] = job_writes._create_all(
        [dataclasses.replace(new, job={**new.job, "ticket": ticket})]
    )
    assert isinstance(refused, redis.ConnectionError)
    # The refusal is what the agent hears: a cancel after it no longer overtakes.
    assert not ticket.cancel("too late")
    assert not Job.objects.filter(call_id="refused").exists()
