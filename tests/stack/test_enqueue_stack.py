"""Jobs started from Django code (`capability.enqueue()`), on the real stack: this
process is the host's code, Celery's worker runs the jobs, and the handle reads them.

A job for a user runs with `ctx.user` and its result waits in its row; `cancel()`
goes through the one pipeline and the work stops; every refusal an agent would get
stores nothing; and the worker checks `authorize` again when a row changed hands
while the job waited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.test import override_settings

from capabilities import EnqueueRefused, JobHandle
from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus
from tests.notes.abp_capabilities import ExportParams, Rename, export_notes, rename_note
from tests.notes.models import Note
from tests.support.people import person
from tests.support.stack import Stack
from tests.support.waiting import eventually
from tests.testapp.abp_capabilities import run_sleep

pytestmark = pytest.mark.usefixtures("stack")


def user(*perms: str) -> Any:
    return person(*perms, prefix="e")


def reader() -> Any:
    return user("notes.view_note", "notes.change_note")


def settled(handle: JobHandle, timeout: float = 30) -> JobHandle:
    def probe() -> JobHandle | None:
        handle.refresh()
        return handle if handle.is_finished else None

    return eventually(probe, timeout)


def test_a_job_enqueued_for_a_user_runs_as_that_user_and_its_result_waits_in_its_row() -> None:
    ann, bob = reader(), reader()
    Note.objects.bulk_create(
        [Note(owner=ann, title="ann 1"), Note(owner=ann, title="ann 2"), Note(owner=bob, title="b")]
    )
    handle = export_notes.enqueue(ExportParams(), user=ann)
    assert handle.status == JobStatus.QUEUED
    settled(handle)
    assert handle.status == JobStatus.SUCCEEDED
    assert handle.error is None
    assert handle.result is not None
    assert handle.result["notes"] == 2
    with default_storage.open(handle.result["csv"]["$file"]) as saved:
        rows = saved.read().decode().splitlines()[1:]
    assert [row.split(",", 1)[1] for row in rows] == ["ann 1", "ann 2"]  # ctx.user's alone
    job = Job.objects.select_related("session").get(pk=handle.id)
    assert job.worker  # a worker ran it
    assert (job.user_id, job.principal, job.session.door) == (ann.pk, f"user:{ann.pk}", Door.APP)
    assert job.delivered_at is None  # nobody to deliver to: the answer waits here
    assert export_notes.get_result(handle.id, user=ann).result == handle.result


def test_cancel_settles_it_for_the_user_and_the_work_stops(stack: Stack) -> None:
    ann = reader()
    handle = run_sleep.enqueue({"steps": 3000, "stepMs": 20}, user=ann)  # 60 s of work

    def running() -> JobHandle | None:
        handle.refresh()
        return handle if handle.status == JobStatus.RUNNING else None

    eventually(running, timeout=30)
    assert handle.cancel() is True
    assert handle.status == JobStatus.CANCELLED
    assert handle.error is not None
    assert handle.error.code == "CANCELLED"
    assert handle.cancel() is False  # settled already
    stopped = eventually(
        Job.objects.filter(pk=handle.id, stopped_at__isnull=False).first, timeout=30
    )
    assert stopped.cancel_source == CancelSource.USER
    assert not stopped.hard_killed
    # Stopped by the cancel itself, at a checkpoint (the worker says so), not run out.
    eventually(lambda: f"Job {handle.id} stopped on cancel" in stack.worker.log_text(), 30)


@pytest.fixture
def stores_nothing() -> Iterator[None]:
    jobs = Job.objects.count()
    sessions = AgentSession.objects.filter(door=Door.APP).count()
    yield
    assert Job.objects.count() == jobs
    assert AgentSession.objects.filter(door=Door.APP).count() == sessions


@pytest.mark.usefixtures("stores_nothing")
def test_every_refusal_an_agent_would_get_stores_nothing() -> None:
    bob = reader()
    theirs = Note.objects.create(owner=user(), title="theirs")
    refusals: dict[str, Callable[[], JobHandle]] = {
        "no permission": lambda: export_notes.enqueue({}, user=user()),
        "not their note": lambda: rename_note.enqueue(
            Rename(note_id=theirs.pk, title="bob's now"), user=bob
        ),
        "bad params": lambda: export_notes.enqueue({"title_contains": 3}, user=bob),
        "too large": lambda: export_notes.enqueue({"title_contains": "x" * 4096}, user=bob),
    }
    codes = {}
    with override_settings(ABP={**settings.ABP, "MAX_FRAME_BYTES": 1024}):
        for what, enqueue in refusals.items():
            with pytest.raises(EnqueueRefused) as refused:
                enqueue()
            codes[what] = refused.value.code
    assert codes == {
        "no permission": "PERMISSION_DENIED",
        "not their note": "PERMISSION_DENIED",
        "bad params": "INVALID_TYPE",
        "too large": "INVALID_PARAMS",
    }
    assert Note.objects.get(pk=theirs.pk).title == "theirs"


def test_the_worker_checks_again_a_row_that_changed_hands_while_the_job_waited() -> None:
    bob, carol = reader(), reader()
    note = Note.objects.create(owner=bob, title="bob's")
    with transaction.atomic():
        handle = rename_note.enqueue(Rename(note_id=note.pk, title="renamed"), user=bob)
        # Checked and stored; handed to the worker only on commit, by which time the
        # note is no longer bob's.
        Note.objects.filter(pk=note.pk).update(owner=carol)
    settled(handle)
    assert handle.status == JobStatus.FAILED
    assert handle.error is not None
    assert handle.error.code == "PERMISSION_DENIED"
    assert handle.error.details == {
        "capability": "notes.rename",
        "reason": f"note {note.pk} is not yours",
    }
    assert Note.objects.get(pk=note.pk).title == "bob's"
    assert Job.objects.get(pk=handle.id).started_at is not None  # refused where it runs
