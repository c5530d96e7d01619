"""An idempotent start: insert-or-find on (session, callId), with a hash of the call.

The same callId with the same capability and params finds the row that holds it
(`start.CallIdHeld`, to adopt); other params are refused as a reused callId
(`start.CallIdTaken`). In-process, on the run's database (SQLite, or PostgreSQL
with ABP_TEST_DATABASE=postgres, where a failed INSERT aborts its transaction).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import redis
from asgiref.sync import sync_to_async
from django.db import connections

from capabilities.access.principal import Principal
from capabilities.calls import availability, job_writes, start, start_retries
from capabilities.calls.start_ticket import StartTicket
from capabilities.jobs.lifecycle import CallIdInUse
from capabilities.models import AgentSession, Job, JobStatus
from capabilities.protocol import WireError
from capabilities.protocol.call_digest import call_digest
from tests.support import new_jobs

pytestmark = pytest.mark.usefixtures("database")

MARKDOWN = "convert.markdownToHtml"


@pytest.fixture(autouse=True)
def closed_after() -> Iterator[None]:
    """The database thread's connection closed after each test: later tests may not use it."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    # Availability and the rate limiter are read from Redis; every queue has a worker.
    monkeypatch.setattr(availability, "unavailable", lambda capability: None)
    monkeypatch.setattr(
        "capabilities.access.rate_limits.retry_after_ms", mock.AsyncMock(return_value=None)
    )
    # Written rows wait in the database; none is handed to Celery here.
    monkeypatch.setattr("capabilities.jobs.dispatch.may_go_now", lambda *args: False)


@pytest.fixture
def who() -> Principal:
    return new_jobs.principal()


@pytest.fixture
def session_id() -> str:
    found = str(uuid.uuid4())
    AgentSession.objects.create(id=found)
    return found


def request(
    session_id: str, call_id: str, markdown: str = "# x", ticket: StartTicket | None = None
) -> start.CallRequest:
    return start.CallRequest(
        session_id=session_id,
        call_id=call_id,
        request_id=f"r-{call_id}",
        capability=MARKDOWN,
        params={"markdown": markdown},
        timeout_ms=None,
        progress_token=None,
        notify_started=False,
        ticket=ticket,
    )


def started(who: Principal, *calls: start.CallRequest) -> list[Job | Exception]:
    """Each call's start in turn: its job, or what it raised."""

    async def scenario() -> list[Job | Exception]:
        outcomes: list[Job | Exception] = []
        for call in calls:
            try:
                outcomes.append(await start.start(who, call))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    return asyncio.run(scenario())


def rows(session_id: str) -> list[tuple[str, str]]:
    return list(
        Job.objects.filter(session_id=uuid.UUID(session_id))
        .order_by("created_at")
        .values_list("call_id", "status")
    )


def test_the_hash_is_of_the_capability_and_params_whatever_their_key_order() -> None:
    one = call_digest(MARKDOWN, {"markdown": "# x", "options": {"a": 1, "b": [1, 2]}})
    same = call_digest(MARKDOWN, {"options": {"b": [1, 2], "a": 1}, "markdown": "# x"})
    assert one == same
    assert len(one) == 64
    assert call_digest(MARKDOWN, {"markdown": "# y"}) != one
    # Canonical JSON: sorted keys, no spaces, text as UTF-8.
    canonical = '{"capability":"convert.markdownToHtml","params":{"a":1,"markdown":"é"}}'
    assert (
        call_digest(MARKDOWN, {"markdown": "é", "a": 1})
        == hashlib.sha256(canonical.encode()).hexdigest()
    )
    assert call_digest("test.sleep", {"markdown": "# x"}) != call_digest(
        MARKDOWN, {"markdown": "# x"}
    )


def test_a_row_keeps_the_hash_of_its_call(who: Principal, session_id: str) -> None:
    [job] = started(who, request(session_id, "c-1"))
    assert isinstance(job, Job)
    stored = Job.objects.get(pk=job.pk)
    assert stored.params_hash == call_digest(MARKDOWN, {"markdown": "# x"})
    # A door that hashed the call already passes its hash on.
    hashed = call_digest(MARKDOWN, {"markdown": "# z"})
    [job] = started(who, dataclasses.replace(request(session_id, "c-2", "# z"), params_hash=hashed))
    assert isinstance(job, Job)
    assert Job.objects.get(pk=job.pk).params_hash == hashed


def test_the_same_call_again_is_held_and_another_under_its_id_is_refused(
    who: Principal, session_id: str
) -> None:
    first, again, other = started(
        who,
        request(session_id, "c-1"),
        request(session_id, "c-1"),
        request(session_id, "c-1", markdown="# other"),
    )
    assert isinstance(first, Job)
    assert isinstance(again, start.CallIdHeld)
    assert again.job.pk == first.pk
    assert again.job.params == {"markdown": "# x"}
    assert type(other) is start.CallIdTaken
    assert other.error.message == "callId 'c-1' was already used in this session."
    # One row, the first copy's, running its course (a worker of the stack may run it).
    [(call_id, status)] = rows(session_id)
    assert call_id == "c-1"
    assert status != JobStatus.CANCELLED


def test_a_held_call_is_a_refusal_to_a_door_that_never_reuses_ids(
    who: Principal, session_id: str
) -> None:
    # MCP makes its own callIds and catches CallRefused: a held one is refused cleanly.
    _, again = started(who, request(session_id, "c-1"), request(session_id, "c-1"))
    assert isinstance(again, start.CallRefused)
    assert again.error.code == "INVALID_PARAMS"


def test_a_start_its_cancel_won_finds_the_same_call_held(who: Principal, session_id: str) -> None:
    # The row would be written cancelled; the session's call is that first row instead,
    # which the session then cancels the usual way.
    cancelled_twice, cancelled_other = StartTicket(), StartTicket()
    assert cancelled_twice.cancel("no longer needed")
    assert cancelled_other.cancel("no longer needed")
    first, again, other = started(
        who,
        request(session_id, "c-1"),
        request(session_id, "c-1", ticket=cancelled_twice),
        request(session_id, "c-1", markdown="# other", ticket=cancelled_other),
    )
    assert isinstance(first, Job)
    assert isinstance(again, start.CallIdHeld)
    assert again.job.pk == first.pk
    assert type(other) is start.CallIdTaken
    # One row, the first copy's, running its course (a worker of the stack may run it).
    [(call_id, status)] = rows(session_id)
    assert call_id == "c-1"
    assert status != JobStatus.CANCELLED


def test_a_row_written_cancelled_claims_for_its_generation(who: Principal, session_id: str) -> None:
    ticket = StartTicket()
    assert ticket.cancel("no longer needed")
    call = request(session_id, "c-1", ticket=ticket)
    [job] = started(who, dataclasses.replace(call, generation=4))
    assert isinstance(job, Job)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.delivered_generation) == (JobStatus.CANCELLED, 4)
    assert stored.delivered_at is not None


def test_a_batch_finds_the_row_its_own_duplicate_holds(who: Principal, session_id: str) -> None:
    # In one transaction the duplicate's INSERT fails (and on PostgreSQL aborts the
    # transaction): the batch is written again one row at a time, and the lookup runs then.
    def item(call_id: str, markdown: str = "# x") -> job_writes.NewJob:
        new = new_jobs.new_job(who, session_id, call_id, run_by=None)
        return job_writes.NewJob(principal=who, job={**new.job, "params": {"markdown": markdown}})

    first, same, other, last = job_writes._create_all(
        [item("a"), item("a"), item("a", "# other"), item("b")]
    )
    assert isinstance(first, Job)
    assert isinstance(same, CallIdInUse)
    assert same.existing is not None
    assert same.existing.pk == first.pk
    assert isinstance(other, CallIdInUse)
    assert other.existing is None
    assert isinstance(last, Job)
    assert [call_id for call_id, _ in rows(session_id)] == ["a", "b"]


def test_the_first_attempt_finding_its_call_held_is_not_taken_as_its_own(
    who: Principal, session_id: str
) -> None:
    # Only a retry's lost answer makes a held row this start's own.
    new = new_jobs.new_job(who, session_id, "c-1", run_by=None)
    [first] = job_writes._create_all([new])
    assert isinstance(first, Job)

    async def scenario() -> Job:
        return await start_retries.stored(job_writes.create(new), new)

    with pytest.raises(CallIdInUse) as raised:
        asyncio.run(scenario())
    assert raised.value.existing is not None
    assert raised.value.existing.pk == first.pk


def test_the_in_use_error_keeps_its_old_constructor() -> None:
    in_use: Any = CallIdInUse("c-1")
    assert (in_use.call_id, in_use.existing, str(in_use)) == ("c-1", None, "c-1")


NO_WORKER = WireError(code="CAPABILITY_UNAVAILABLE", message="No live worker.", retryable=True)


def redis_unreadable(capability: str) -> None:
    raise redis.exceptions.ConnectionError("Connection closed by server.")


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(redis_unreadable, id="redis-unreadable"),
        pytest.param(lambda capability: NO_WORKER, id="no-live-worker"),
    ],
)
def test_a_refused_copy_of_a_held_call_is_that_call(
    who: Principal, session_id: str, monkeypatch: pytest.MonkeyPatch, refusal: Any
) -> None:
    # A copy re-sent after a resume while Redis was down: the row its callId holds (here
    # written cancelled, as a cancel that won the lost connection's start writes it)
    # is the call's answer, not the refusal of the copy.
    ticket = StartTicket()
    assert ticket.cancel("no longer needed")
    [first] = started(who, request(session_id, "c-1", ticket=ticket))
    assert isinstance(first, Job)
    monkeypatch.setattr(availability, "unavailable", refusal)
    again, other, fresh = started(
        who,
        request(session_id, "c-1"),
        request(session_id, "c-1", markdown="# other"),
        request(session_id, "c-2"),
    )
    assert isinstance(again, start.CallIdHeld)
    assert again.job.pk == first.pk
    assert type(other) is start.CallIdTaken
    # A callId the session does not hold is refused as before.
    assert type(fresh) is start.CallRefused
    assert rows(session_id) == [("c-1", JobStatus.CANCELLED)]
