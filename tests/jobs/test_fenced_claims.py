"""Fenced delivery claims: a claim carries its connection's session generation.

A claim is written only where none is held, and records its generation; a release
clears only its own generation's claim, and announces only what it gave back; a
resume takes over the claims of the results it sends again. Against the run's
database (SQLite, or PostgreSQL with ABP_TEST_DATABASE).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from capabilities.access.principal import Principal
from capabilities.calls import session_records
from capabilities.endings import cancellation, resumption
from capabilities.jobs import lifecycle, notes
from capabilities.models import AgentSession, CancelSource, Job

pytestmark = pytest.mark.usefixtures("database")

TOKEN = "the-token"


@pytest.fixture
def returned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The notes sent (to session groups) instead of Redis."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def notify(session_id: str, note: dict[str, Any]) -> bool:
        sent.append((session_id, note))
        return True

    monkeypatch.setattr(notes, "notify", notify)
    return sent


def new_job(session: AgentSession | None = None, *, settled: bool = True) -> Job:
    session = session or AgentSession.objects.create(agent_name="fences")
    job = Job.objects.create(
        session=session, call_id=str(uuid.uuid4()), capability="test.sleep", params={}
    )
    if settled:
        assert lifecycle.settle(job.id, lifecycle.Outcome.succeeded({"ok": True}))
    return job


def claim_of(job: Job) -> tuple[bool, int | None]:
    row = Job.objects.get(pk=job.pk)
    return row.delivered_at is not None, row.delivered_generation


def test_a_claim_is_held_once_and_only_its_own_generation_gives_it_back(
    returned: list[tuple[str, dict[str, Any]]],
) -> None:
    job = new_job()
    assert lifecycle.claim_delivery(job.id, 3)
    assert claim_of(job) == (True, 3)
    assert not lifecycle.claim_delivery(job.id, 3)  # once
    assert not lifecycle.claim_delivery(job.id, 4)  # a takeover's socket does not send it again
    assert not lifecycle.release_delivery(job.id, 4)  # not 4's: a no-op
    assert claim_of(job) == (True, 3)
    assert returned == []
    assert lifecycle.release_delivery(job.id, 3)
    assert claim_of(job) == (False, None)
    assert returned == [(str(job.session_id), notes.job_returned(str(job.id)))]
    assert lifecycle.claim_delivery(job.id, 4)  # given back: the session's holder claims it


def test_a_job_still_active_is_never_claimed() -> None:
    job = new_job(settled=False)
    assert not lifecycle.claim_delivery(job.id, 1)
    assert not lifecycle.claim_delivery(job.id)
    assert claim_of(job) == (False, None)


def test_generation_zero_claims_once_until_given_back(
    returned: list[tuple[str, dict[str, Any]]],
) -> None:
    # MCP's calls have no generations: they claim as 0, as every claim did before fences.
    job = new_job()
    assert lifecycle.claim_delivery(job.id)
    assert not lifecycle.claim_delivery(str(job.id))
    assert claim_of(job) == (True, 0)
    assert lifecycle.release_delivery(job.id)
    assert len(returned) == 1
    assert lifecycle.claim_delivery(job.id)
    assert not lifecycle.release_delivery(job.id, 1)  # not 1's claim
    assert claim_of(job) == (True, 0)


def test_a_settle_or_cancel_that_claims_stamps_its_generation() -> None:
    answered_here = new_job(settled=False)
    assert lifecycle.settle(
        answered_here.id, lifecycle.Outcome.succeeded({}), delivered=True, generation=2
    )
    assert claim_of(answered_here) == (True, 2)
    cancelled = new_job(settled=False)
    won = cancellation.settle_cancelled(
        [str(cancelled.id)], CancelSource.AGENT, delivered=True, generation=5
    )
    assert won == {str(cancelled.id): True}
    assert claim_of(cancelled) == (True, 5)
    assert not lifecycle.claim_delivery(cancelled.id, 5)
    assert not lifecycle.claim_delivery(cancelled.id, 6)


def test_a_row_written_cancelled_is_claimed_for_its_generation() -> None:
    # Its cancel won the start's ticket: its connection answered before the row existed.
    session = AgentSession.objects.create(agent_name="fences")
    job = lifecycle.create_job(
        session_id=str(session.pk),
        call_id="c-1",
        request_id="r-1",
        capability="test.sleep",
        params={},
        timeout_ms=None,
        progress_token=None,
        settled=lifecycle.Outcome.cancelled(CancelSource.AGENT, "no longer needed"),
        generation=4,
    )
    assert claim_of(job) == (True, 4)
    assert not lifecycle.claim_delivery(job.id, 4)


def test_claim_response_claims_for_its_generation() -> None:
    job = new_job()
    response = {"callId": job.call_id}
    assert session_records.claim_response(str(job.id), "", response, generation=1) == response
    assert (
        session_records.claim_response(str(job.id), "", response, generation=1)
        is session_records.NotClaimed.DELIVERED_ELSEWHERE
    )
    assert (
        session_records.claim_response(str(job.id), "", response, generation=2)
        is session_records.NotClaimed.DELIVERED_ELSEWHERE
    )
    active = new_job(settled=False)
    assert (
        session_records.claim_response(str(active.id), "", None, generation=2)
        is session_records.NotClaimed.STILL_ACTIVE
    )


def test_a_resume_claims_what_it_sends_again_for_its_generation(
    returned: list[tuple[str, dict[str, Any]]],
) -> None:
    principal = Principal(kind="anonymous", key=None, client_address="127.0.0.1")
    session = AgentSession.objects.create(
        agent_name="fences", auth=principal.kind, resume_hash=resumption.token_hash(TOKEN)
    )
    sent_unread, unclaimed, not_awaited = (new_job(session) for _ in range(3))
    for job in (sent_unread, not_awaited):
        assert lifecycle.claim_delivery(job.id, 0)
    resumed = resumption.resume(
        str(session.pk),
        TOKEN,
        principal,
        "next-token",
        awaiting=(sent_unread.call_id, unclaimed.call_id, not_awaited.call_id + "-not"),
    )
    assert resumed.generation == 1
    assert [job.pk for job in resumed.again] == [sent_unread.pk]
    assert [job.pk for job in resumed.jobs] == [unclaimed.pk]
    assert claim_of(sent_unread) == (True, 1)
    assert claim_of(not_awaited) == (True, 0)
    # The old connection's socket was gone: its give-back changes nothing now, and the
    # new generation, which sent it again, cannot claim it a second time.
    assert not lifecycle.release_delivery(sent_unread.id, 0)
    assert returned == []
    assert not lifecycle.claim_delivery(sent_unread.id, 1)
    assert claim_of(sent_unread) == (True, 1)
