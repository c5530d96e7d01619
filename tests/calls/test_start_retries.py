"""A call's row written again while the database is away (calls/start_retries.py).

In-process, on the run's database: the database's absence is an OperationalError
raised where the real write would have answered, once or several times.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connections
from django.test import override_settings

from capabilities.calls import availability, job_writes, start_retries
from capabilities.jobs import outages
from capabilities.jobs.lifecycle import CallIdInUse
from capabilities.models import AgentSession, Job
from tests.support import new_jobs

pytestmark = pytest.mark.usefixtures("database")

RESTARTING = "terminating connection due to administrator command"


@pytest.fixture(autouse=True)
def closed_after() -> Iterator[None]:
    """The database thread's connection closed after each test: later tests may not use it."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(availability, "unavailable", lambda capability: None)
    monkeypatch.setattr(outages, "PAUSES", (0.01,))


def new_job(call_id: str) -> job_writes.NewJob:
    session_id = str(uuid.uuid4())
    AgentSession.objects.create(id=session_id)
    return new_jobs.new_job(new_jobs.principal(), session_id, call_id)


def failing(error: Exception) -> asyncio.Future[Job]:
    future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


def run_stored(
    new: job_writes.NewJob, first: Callable[[], asyncio.Future[Job]], attempts: list[str]
) -> Job:
    real_create = job_writes.create

    def create(again: job_writes.NewJob) -> asyncio.Future[Job]:
        attempts.append("again")
        return real_create(again)

    async def scenario() -> Job:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job_writes, "create", create)
            return await start_retries.stored(first(), new)

    return asyncio.run(scenario())


def rows_of(new: job_writes.NewJob) -> list[Any]:
    return list(
        Job.objects.filter(session_id=new.job["session_id"]).values_list("call_id", flat=True)
    )


def test_a_row_that_meets_the_database_away_is_written_once_it_is_back() -> None:
    new = new_job("away")
    attempts: list[str] = []
    job = run_stored(new, lambda: failing(OperationalError(RESTARTING)), attempts)
    assert job.call_id == "away"
    assert attempts == ["again"]
    assert rows_of(new) == ["away"]


def test_a_row_written_by_an_attempt_whose_answer_was_lost_is_read_back() -> None:
    new = new_job("in-doubt")

    def written_then_lost() -> asyncio.Future[Job]:
        job_writes._create_all([new])  # committed; the connection broke before the answer
        return failing(OperationalError("server closed the connection unexpectedly"))

    attempts: list[str] = []
    job = run_stored(new, written_then_lost, attempts)
    assert attempts == ["again"]
    assert job.call_id == "in-doubt"
    assert rows_of(new) == ["in-doubt"]  # one row: never written twice


def test_a_call_id_taken_at_the_first_attempt_is_a_real_duplicate() -> None:
    new = new_job("twice")
    job_writes._create_all([new])
    with pytest.raises(CallIdInUse):
        run_stored(new, lambda: failing(CallIdInUse("twice")), [])


def test_the_database_away_longer_than_the_retry_window_refuses_the_call() -> None:
    new = new_job("long-outage")
    attempts: list[str] = []

    def still_away(again: job_writes.NewJob) -> asyncio.Future[Job]:
        attempts.append("again")
        return failing(OperationalError(RESTARTING))

    async def scenario() -> Job:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job_writes, "create", still_away)
            return await start_retries.stored(failing(OperationalError(RESTARTING)), new)

    with (
        override_settings(ABP={**settings.ABP, "START_RETRY_SECONDS": 0.1}),
        pytest.raises(OperationalError),
    ):
        asyncio.run(scenario())
    assert 3 <= len(attempts) <= 11
    assert rows_of(new) == []
