"""The settle function and job state changes, against the real (SQLite) database."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from capabilities.jobs import lifecycle as jobs
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError

pytestmark = pytest.mark.usefixtures("database")


def new_job(**fields: object) -> Job:
    session = AgentSession.objects.create(agent_name="unit")
    return Job.objects.create(
        session=session, call_id=str(uuid.uuid4()), capability="test.sleep", params={}, **fields
    )


def test_first_outcome_wins_and_later_ones_are_dropped() -> None:
    job = new_job()
    assert jobs.settle(job.id, jobs.Outcome.succeeded({"a": [1, "é", None]}))
    assert not jobs.settle(job.id, jobs.Outcome.cancelled(CancelSource.AGENT))
    assert not jobs.settle(job.id, jobs.Outcome.failed(WireError(code="X", message="m")))
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.result == {"a": [1, "é", None]}
    assert job.error_code == ""
    assert job.cancel_source == ""
    assert job.settled_at is not None


def test_cancel_of_a_queued_job_records_that_its_work_stopped() -> None:
    job = new_job()
    assert jobs.settle(job.id, jobs.Outcome.cancelled(CancelSource.AGENT, "why not"))
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.stopped_at == job.settled_at
    assert job.error_code == ErrorCode.CANCELLED
    assert job.cancel_reason == "why not"
    assert job.error_retryable is False


def test_cancel_of_a_running_job_leaves_the_stop_to_the_worker() -> None:
    job = new_job()
    assert jobs.mark_running(str(job.id), "w1")
    assert not jobs.mark_running(str(job.id), "w2")  # a duplicate delivery
    assert jobs.settle(job.id, jobs.Outcome.cancelled(CancelSource.TIMEOUT))
    job.refresh_from_db()
    assert job.worker == "w1"
    assert job.stopped_at is None
    assert job.error_code == ErrorCode.TIMEOUT
    assert job.error_retryable is True
    jobs.record_stopped(str(job.id))
    job.refresh_from_db()
    assert job.stopped_at is not None


def test_failure_keeps_the_traceback_and_details() -> None:
    job = new_job()
    error = WireError(code="INVALID_PARAMS", message="bad", details={"path": "params.x"})
    assert jobs.settle(job.id, jobs.Outcome.failed(error, traceback="Traceback ..."))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_details == {"path": "params.x"}
    assert job.error_traceback == "Traceback ..."


def test_a_settled_job_never_starts() -> None:
    job = new_job()
    jobs.settle(job.id, jobs.Outcome.cancelled(CancelSource.OPERATOR))
    assert not jobs.mark_running(str(job.id), "w1")


def _settle_at_the_same_time(
    barrier: threading.Barrier, job_id: uuid.UUID, outcome: jobs.Outcome, wins: list[bool]
) -> None:
    try:
        barrier.wait()
        wins.append(jobs.settle(job_id, outcome))
    finally:
        connection.close()  # each thread has its own


def test_concurrent_settles_have_exactly_one_winner() -> None:
    outcomes = [
        jobs.Outcome.succeeded({}),
        jobs.Outcome.cancelled(CancelSource.AGENT),
        jobs.Outcome.cancelled(CancelSource.TIMEOUT),
        jobs.Outcome.failed(WireError(code="X", message="m")),
    ]
    for _ in range(20):
        job = new_job()
        wins: list[bool] = []
        barrier = threading.Barrier(len(outcomes))
        threads = [
            threading.Thread(target=_settle_at_the_same_time, args=(barrier, job.id, o, wins))
            for o in outcomes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(wins) == [False, False, False, True]


def test_call_ids_are_unique_per_session_only() -> None:
    first = new_job()
    other_session = AgentSession.objects.create(agent_name="other")
    Job.objects.create(session=other_session, call_id=first.call_id, capability="x", params={})
    assert jobs.find_call(other_session.id, first.call_id) is not None
    assert jobs.find_call(first.session_id, first.call_id) == first
    assert jobs.find_call(uuid.uuid4(), first.call_id) is None


# -- every interleaving of outcomes and deliveries ---------------------------------------

OUTCOMES = {
    "worker succeeds": (jobs.Outcome.succeeded({"ok": True}), False),
    "worker fails": (
        jobs.Outcome.failed(WireError(code=ErrorCode.OPERATION_FAILED, message="no")),
        False,
    ),
    "agent cancels": (jobs.Outcome.cancelled(CancelSource.AGENT), True),
    "timeout": (jobs.Outcome.cancelled(CancelSource.TIMEOUT), True),
    "disconnect": (jobs.Outcome.cancelled(CancelSource.DISCONNECT), False),
    "operator": (jobs.Outcome.cancelled(CancelSource.OPERATOR), False),
    "shutdown": (jobs.Outcome.cancelled(CancelSource.SHUTDOWN), True),
}


class SettleAndDeliver(RuleBasedStateMachine):
    """Settles from every source and delivery claims from two connections, in any order.

    The first settle decides the outcome; a result is claimed for sending once (by a
    consumer's winning cancel, or by one claim) until a connection gives it back.
    """

    def __init__(self) -> None:
        super().__init__()
        self.job = new_job()
        self.decided: str | None = None
        self.claimed = False

    @rule(source=st.sampled_from(sorted(OUTCOMES)), start_first=st.booleans())
    def settle(self, source: str, start_first: bool) -> None:
        if start_first:
            jobs.mark_running(str(self.job.id), "w")
        outcome, delivered = OUTCOMES[source]
        won = jobs.settle(self.job.id, outcome, delivered=delivered)
        assert won == (self.decided is None)
        if won:
            self.decided = source
            self.claimed = delivered

    @rule(connection=st.sampled_from(["A", "B"]))
    def claim(self, connection: str) -> None:
        claimed = jobs.claim_delivery(self.job.id)
        assert claimed == (self.decided is not None and not self.claimed), connection
        self.claimed = self.claimed or claimed

    @rule()
    def give_back(self) -> None:
        if self.claimed:
            jobs.release_delivery(self.job.id)
            self.claimed = False

    @invariant()
    def row_matches(self) -> None:
        row = Job.objects.get(pk=self.job.pk)
        assert row.is_active == (self.decided is None)
        assert (row.delivered_at is not None) == self.claimed
        if self.decided is not None:
            outcome, _ = OUTCOMES[self.decided]
            assert row.status == outcome.status
            assert row.cancel_source == (outcome.cancel_source or "")


TestSettleAndDeliver = SettleAndDeliver.TestCase
TestSettleAndDeliver.settings = settings(max_examples=150, stateful_step_count=12, deadline=None)
