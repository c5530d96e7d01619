"""Jobs Django code starts (`capability.enqueue()`): the checks of an agent's call
before anything is stored, the rows written, the hand-over on commit, lookups bound
to the user, and nothing of the reaper's that waits on a connection.

In-process, on the run's database. Seams: whether a worker lives (Redis) and the
hand-over to Celery are replaced; a real worker running these jobs is
tests/stack/test_enqueue_stack.py.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.test import RequestFactory, override_settings
from django.utils import timezone

from capabilities import EnqueueRefused, JobNotFound
from capabilities.access import agent_keys
from capabilities.access.principal import Principal
from capabilities.calls import app_calls, availability, budgets
from capabilities.endings import resumption
from capabilities.jobs import lifecycle, notes
from capabilities.models import AgentSession, Door, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError
from tests.notes import views
from tests.notes.abp_capabilities import ExportParams, Rename, export_notes, rename_note
from tests.notes.models import Note
from tests.support.paths import ROOT
from tests.support.people import person
from tests.testapp.abp_capabilities import run_sleep

pytestmark = pytest.mark.usefixtures("database")

NO_WORKER = WireError(
    code=ErrorCode.CAPABILITY_UNAVAILABLE, message="No worker.", retryable=True, retry_after_ms=9
)


class Seams:
    """Which queues have a worker, and which jobs were handed over (on commit)."""

    def __init__(self) -> None:
        self.unavailable: WireError | None = None
        self.sent: list[str] = []


@pytest.fixture(autouse=True)
def seams(monkeypatch: pytest.MonkeyPatch) -> Seams:
    found = Seams()
    monkeypatch.setattr(availability, "unavailable", lambda capability: found.unavailable)
    monkeypatch.setattr("capabilities.jobs.dispatch.may_go_now", lambda *args: False)
    monkeypatch.setattr(
        "capabilities.jobs.dispatch.created", lambda job: found.sent.append(str(job.id))
    )
    return found


def user(*perms: str, active: bool = True) -> Any:
    return person(*perms, active=active, prefix="a")


@pytest.fixture
def ann() -> Any:
    return user("notes.view_note", "notes.change_note")


def sessions_of(who: Any) -> int:
    return AgentSession.objects.filter(principal=f"user:{who.pk}").count()


@pytest.fixture
def stores_nothing(ann: Any, seams: Seams) -> Iterator[None]:
    """The test's refusals leave no job, no session row, nothing handed over."""
    jobs, sessions = Job.objects.count(), AgentSession.objects.count()
    yield
    assert (Job.objects.count(), AgentSession.objects.count()) == (jobs, sessions)
    assert not seams.sent


def test_a_job_for_a_user_is_stored_as_an_agents_call_is_and_handed_over(
    ann: Any, seams: Seams
) -> None:
    handle = export_notes.enqueue(ExportParams(title_contains="a"), user=ann)
    job = Job.objects.select_related("session").get(pk=handle.id)
    assert (job.capability, job.params, job.status) == (
        "notes.export",
        {"title_contains": "a"},
        JobStatus.QUEUED,
    )
    # The user's own budget, the one their agents spend; no key or client made it.
    assert (job.user_id, job.principal, job.client) == (ann.pk, f"user:{ann.pk}", "")
    assert job.deadline is not None
    assert job.deadline - job.created_at == timedelta(
        milliseconds=settings.ABP.get("DEFAULT_TIMEOUT_MS", 600_000)
    )
    session = job.session
    assert (session.door, session.auth, session.per_call) == (Door.APP, "app", True)
    assert session.closed_at is not None  # nobody is connected to be answered
    assert session.close_reason == app_calls.NOBODY_CONNECTED
    assert seams.sent == [handle.id]
    assert (handle.status, handle.result, handle.error, handle.user_id) == (
        "queued",
        None,
        None,
        ann.pk,
    )


def test_in_a_transaction_the_job_is_handed_over_on_commit_and_a_rollback_leaves_nothing(
    ann: Any, seams: Seams
) -> None:
    with transaction.atomic():
        handle = export_notes.enqueue({}, user=ann)
        assert not seams.sent
    assert seams.sent == [handle.id]
    before = Job.objects.count(), sessions_of(ann)

    def enqueue_then_roll_back() -> None:
        with transaction.atomic():
            export_notes.enqueue({}, user=ann)
            transaction.set_rollback(True)

    enqueue_then_roll_back()
    assert (Job.objects.count(), sessions_of(ann)) == before
    assert seams.sent == [handle.id]


@pytest.mark.usefixtures("stores_nothing")
@pytest.mark.parametrize(
    ("params", "code", "path"),
    [
        ({"title_contains": 5}, "INVALID_TYPE", "params.title_contains"),
        ({"title": "x"}, "INVALID_PARAMS", "params"),
        ({"title_contains": "\x00"}, "INVALID_PARAMS", "params.title_contains"),
        ({"title_contains": datetime.date(2026, 1, 1)}, "INVALID_PARAMS", "params"),
        ({"title_contains": "x" * 2000}, "INVALID_PARAMS", "params"),
    ],
)
def test_params_an_agent_could_not_send_are_refused_with_its_code(
    ann: Any, params: dict[str, Any], code: str, path: str
) -> None:
    with (
        override_settings(ABP={**settings.ABP, "MAX_FRAME_BYTES": 1024}),
        pytest.raises(EnqueueRefused) as refused,
    ):
        export_notes.enqueue(params, user=ann)
    assert refused.value.code == code
    assert refused.value.details is not None
    assert refused.value.details["path"] == path


@pytest.mark.usefixtures("stores_nothing")
def test_a_timeout_out_of_bounds_is_refused(ann: Any) -> None:
    for asked in (0, 10**10):
        with pytest.raises(EnqueueRefused) as refused:
            export_notes.enqueue({}, user=ann, timeout_ms=asked)
        assert refused.value.code == "INVALID_PARAMS"
        assert refused.value.details == {
            "path": "timeout_ms",
            "max": settings.ABP.get("MAX_TIMEOUT_MS", 3_600_000),
        }


@pytest.mark.usefixtures("stores_nothing")
def test_whom_the_permissions_or_the_check_refuse_is_refused_with_the_reason(ann: Any) -> None:
    theirs = Note.objects.create(owner=user(), title="theirs")
    with pytest.raises(EnqueueRefused) as not_theirs:
        rename_note.enqueue(Rename(note_id=theirs.pk, title="mine now"), user=ann)
    assert not_theirs.value.code == "PERMISSION_DENIED"
    assert not_theirs.value.details == {
        "capability": "notes.rename",
        "reason": f"note {theirs.pk} is not yours",
    }
    for who in (user(), None, AnonymousUser()):
        with pytest.raises(EnqueueRefused) as lacking:
            export_notes.enqueue({}, user=who)
        assert lacking.value.code == "PERMISSION_DENIED"
        assert lacking.value.details is not None
        assert lacking.value.details["missing"] == ["notes.view_note"]
    with pytest.raises(EnqueueRefused) as inactive:
        run_sleep.enqueue({"steps": 1}, user=user(active=False))
    assert inactive.value.code == "PERMISSION_DENIED"
    assert Note.objects.get(pk=theirs.pk).title == "theirs"


@pytest.mark.usefixtures("stores_nothing")
def test_no_live_worker_is_refused_as_for_an_agent(ann: Any, seams: Seams) -> None:
    seams.unavailable = NO_WORKER
    with pytest.raises(EnqueueRefused) as refused:
        export_notes.enqueue({}, user=ann)
    assert (refused.value.code, refused.value.retryable, refused.value.retry_after_ms) == (
        "CAPABILITY_UNAVAILABLE",
        True,
        9,
    )


def test_a_users_enqueued_jobs_and_agent_calls_share_one_budget(ann: Any) -> None:
    key, _ = agent_keys.create_key("ann's agent", owner=ann)
    agent = Principal(kind="key", key=key, client_address="", user_id=ann.pk)
    session = AgentSession.objects.create(principal=agent.rate_limit_id)
    with override_settings(ABP={**settings.ABP, "MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": 1}):
        budgets.create_job(
            agent, session_id=str(session.pk), call_id="agent", request_id="",
            capability="notes.export", params={}, timeout_ms=None, progress_token=None,
        )  # fmt: skip
        before = Job.objects.count(), sessions_of(ann)
        with pytest.raises(EnqueueRefused) as refused:
            export_notes.enqueue({}, user=ann)
        assert (Job.objects.count(), sessions_of(ann)) == before
        assert refused.value.code == "RATE_LIMITED"
        assert refused.value.details == {"limit": "callsInFlight", "max": 1}
        # Code for nobody spends a budget of its own.
        assert run_sleep.enqueue({"steps": 1}).user_id is None
    assert Job.objects.filter(principal="app").exists()


def test_a_job_is_found_only_by_its_user_and_its_capability(ann: Any) -> None:
    handle = export_notes.enqueue({}, user=ann)
    assert export_notes.get_result(handle.id, user=ann).id == handle.id
    for who in (user("notes.view_note"), None, AnonymousUser()):
        with pytest.raises(JobNotFound):
            export_notes.get_result(handle.id, user=who)
    with pytest.raises(JobNotFound):
        rename_note.get_result(handle.id, user=ann)
    with pytest.raises(JobNotFound):
        export_notes.get_result("not-a-uuid", user=ann)
    with pytest.raises(JobNotFound):  # before anything is cancelled
        export_notes.get_result(handle.id, user=user()).cancel()


def test_for_nobody_only_django_codes_own_jobs_are_found() -> None:
    mine = run_sleep.enqueue({"steps": 1})
    assert run_sleep.get_result(mine.id).id == mine.id
    service = agent_keys.create_key("a service")[0]
    agent = Principal(kind="key", key=service, client_address="")
    session = AgentSession.objects.create(principal=agent.rate_limit_id)
    theirs = budgets.create_job(
        agent, session_id=str(session.pk), call_id="svc", request_id="",
        capability="test.sleep", params={}, timeout_ms=None, progress_token=None,
    )  # fmt: skip
    with pytest.raises(JobNotFound):
        run_sleep.get_result(str(theirs.pk))


def test_the_handle_reads_a_result_or_an_error_from_the_row(ann: Any) -> None:
    done, failed = (export_notes.enqueue({}, user=ann) for _ in range(2))
    assert lifecycle.settle(done.id, lifecycle.Outcome.succeeded({"notes": 0, "csv": {}}))
    error = WireError(code=ErrorCode.OPERATION_FAILED, message="No.", details={"why": 1})
    assert lifecycle.settle(failed.id, lifecycle.Outcome.failed(error))
    done.refresh()
    failed.refresh()
    assert (done.status, done.result, done.error, done.is_finished) == (
        "succeeded",
        {"notes": 0, "csv": {}},
        None,
        True,
    )
    assert (failed.status, failed.result) == ("failed", None)
    assert failed.error == WireError(
        code="OPERATION_FAILED", message="No.", retryable=False, details={"why": 1}
    )


def test_no_reaper_sweep_nudges_or_expires_what_nobody_is_connected_to(
    ann: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[str] = []

    def notify(session_id: str, note: Any) -> int:
        told.append(session_id)
        return 1

    monkeypatch.setattr(notes, "notify", notify)
    waiting, settled = (export_notes.enqueue({}, user=ann) for _ in range(2))
    long_ago = timezone.now() - timedelta(days=2)
    ids = [waiting.id, settled.id]
    AgentSession.objects.filter(jobs__pk__in=ids).update(seen_at=long_ago)
    assert lifecycle.settle(settled.id, lifecycle.Outcome.succeeded({"notes": 0, "csv": {}}))
    Job.objects.filter(pk=settled.id).update(settled_at=timezone.now() - timedelta(seconds=5))
    with override_settings(ABP={**settings.ABP, "RESUME_GRACE_SECONDS": 86_400}):
        resumption.expire_abandoned()
    resumption.nudge_undelivered()
    sessions = {str(s) for s in Job.objects.filter(pk__in=ids).values_list("session_id", flat=True)}
    assert not sessions & set(told)
    waiting.refresh()
    assert waiting.status == "queued"
    assert Job.objects.get(pk=settled.id).delivered_at is None  # the result waits in its row


def test_the_docs_view_starts_the_signed_in_users_export_and_refuses_one_without_the_right(
    ann: Any, seams: Seams
) -> None:
    """docs/your-capabilities.md's view is tests/notes/views.py, run as written."""
    text = (ROOT / "docs" / "your-capabilities.md").read_text()
    (block,) = re.findall(r"```python\n(# notes/views\.py\n.*?)```", text, re.DOTALL)
    assert (ROOT / "tests" / "notes" / "views.py").read_text() == block
    factory = RequestFactory()

    def as_user(request: Any, who: Any) -> Any:
        request.user = who
        return request

    started = views.start_export(as_user(factory.post("/export", {"title_contains": "a"}), ann))
    assert started.status_code == 202
    job_id = _json(started)["job"]
    assert seams.sent == [job_id]
    status = views.export_status(as_user(factory.get("/status"), ann), job_id)
    assert _json(status) == {"job": job_id, "status": "queued"}
    stranger = user("notes.view_note")
    assert views.export_status(as_user(factory.get("/s"), stranger), job_id).status_code == 404
    before = Job.objects.count()
    refused = views.start_export(as_user(factory.post("/export"), user()))
    assert refused.status_code == 403
    assert _json(refused)["code"] == "PERMISSION_DENIED"
    assert Job.objects.count() == before


def _json(response: Any) -> dict[str, Any]:
    import json

    found: dict[str, Any] = json.loads(response.content)
    return found
