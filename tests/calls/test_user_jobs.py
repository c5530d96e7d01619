"""A user's own jobs: listed newest first in bounded pages, read and cancelled by id,
every lookup bound to the user (another user's job is not found)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from capabilities.calls import user_jobs
from capabilities.endings import cancellation
from capabilities.jobs import lifecycle
from capabilities.models import CancelSource, Door, Job, JobStatus
from tests.support.user_jobs import Stops, job_for, new_user, record_stops

pytestmark = pytest.mark.usefixtures("database")


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Stops:
    return record_stops(monkeypatch)


def test_a_users_jobs_from_every_door_newest_first_and_nobody_elses() -> None:
    mine, theirs = new_user(), new_user()
    now = timezone.now()
    made = [
        job_for(mine, door=door, created_at=now - timedelta(seconds=n))
        for n, door in enumerate(Door)
    ]
    job_for(theirs)
    job_for(None)
    page = user_jobs.list_jobs(mine)
    assert [job.id for job in page.jobs] == [job.id for job in made]
    assert {job.session.door for job in page.jobs} == set(Door)
    assert page.next_cursor is None
    assert user_jobs.list_jobs(new_user()).jobs == []


def test_pages_are_bounded_and_the_cursor_walks_them_without_gaps_or_repeats() -> None:
    mine = new_user()
    now = timezone.now()
    # Three jobs share each moment: the cursor must order by id within one.
    made = [job_for(mine, created_at=now - timedelta(seconds=n // 3)) for n in range(11)]
    seen: list[uuid.UUID] = []
    cursor = None
    pages = 0
    while True:
        page = user_jobs.list_jobs(mine, limit=4, cursor=cursor)
        assert len(page.jobs) <= 4
        seen += [job.id for job in page.jobs]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 3
    assert sorted(seen) == sorted(job.id for job in made)
    assert len(set(seen)) == 11
    created = [Job.objects.get(pk=job_id).created_at for job_id in seen]
    assert created == sorted(created, reverse=True)


def test_a_page_is_never_larger_than_the_bound() -> None:
    mine = new_user()
    for _ in range(user_jobs.MAX_PAGE_SIZE + 2):
        job_for(mine)
    assert len(user_jobs.list_jobs(mine, limit=10_000).jobs) == user_jobs.MAX_PAGE_SIZE
    assert len(user_jobs.list_jobs(mine, limit=0).jobs) == 1
    assert len(user_jobs.list_jobs(mine).jobs) == user_jobs.PAGE_SIZE


def test_the_status_filter_takes_one_status_or_a_group() -> None:
    mine = new_user()
    jobs = {status: job_for(mine, status=status) for status in JobStatus}

    def shown(status: str) -> set[uuid.UUID]:
        return {job.id for job in user_jobs.list_jobs(mine, status=status).jobs}

    assert shown("running") == {jobs[JobStatus.RUNNING].id}
    assert shown("active") == {jobs[JobStatus.QUEUED].id, jobs[JobStatus.RUNNING].id}
    settled = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
    assert shown("settled") == {jobs[status].id for status in settled}
    with pytest.raises(user_jobs.BadFilter, match="status must be one of"):
        user_jobs.list_jobs(mine, status="finished")
    for cursor in ("nonsense", "12.zz", ".", "1e9." + uuid.uuid4().hex):
        with pytest.raises(user_jobs.BadFilter, match="cursor"):
            user_jobs.list_jobs(mine, cursor=cursor)


def test_the_list_reads_the_users_index() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's planner may scan a table this small; SQLite's plan is fixed")
    query = user_jobs.owned_by(new_user()).filter(status__in=["running"]).order_by("-created_at")
    assert "job_user_created_idx" in query.explain()


def test_get_is_bound_to_the_user() -> None:
    mine, theirs = new_user(), new_user()
    job = job_for(mine)
    assert user_jobs.get_job(mine, job.id).id == job.id
    for who, job_id in ((theirs, job.id), (mine, uuid.uuid4())):
        with pytest.raises(user_jobs.JobNotFound):
            user_jobs.get_job(who, job_id)


def test_cancelling_an_own_job_goes_through_the_one_pipeline_as_user(stops: Stops) -> None:
    mine = new_user()
    job = job_for(mine)
    answer = user_jobs.cancel_job(mine, job.id, reason="changed my mind")
    assert answer == user_jobs.CancelAnswer(
        job_id=job.id, cancelled=True, status=JobStatus.CANCELLED
    )
    job.refresh_from_db()
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.USER)
    assert job.cancel_reason == "changed my mind"
    assert job.error_code == "CANCELLED"
    assert job.error_details == {"source": "user"}
    assert stops.flags == stops.revokes == [str(job.id)]
    assert stops.told == [str(job.session_id)]


def test_another_users_job_is_not_found_and_nothing_changes(stops: Stops) -> None:
    mine, theirs = new_user(), new_user()
    job = job_for(mine)
    with pytest.raises(user_jobs.JobNotFound):
        user_jobs.cancel_job(theirs, job.id)
    with pytest.raises(user_jobs.JobNotFound):
        user_jobs.cancel_job(theirs, uuid.uuid4())
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert stops == Stops()


def test_a_settled_job_is_answered_as_it_is(stops: Stops) -> None:
    mine = new_user()
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        job = job_for(mine, status=status)
        answer = user_jobs.cancel_job(mine, job.id)
        assert (answer.cancelled, answer.status) == (False, status)
        job.refresh_from_db()
        assert job.status == status
        assert job.cancel_source == ""
    assert stops == Stops()


def test_a_job_that_settles_while_the_cancel_is_under_way_says_what_it_came_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = new_user()
    job = job_for(mine)

    def finished_first(job_id: uuid.UUID, *, source: CancelSource, reason: str = "") -> bool:
        # The worker's settle wins the race: the cancel's own settle finds it settled.
        assert lifecycle.settle(job_id, lifecycle.Outcome.succeeded({"echo": 1}))
        return False

    monkeypatch.setattr(cancellation, "cancel", finished_first)
    answer = user_jobs.cancel_job(mine, job.id)
    assert (answer.cancelled, answer.status) == (False, JobStatus.SUCCEEDED)
