"""The operators' admin: real jobs in every status, bounded queries, a cancel the agent hears."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.support.admin_clients import client_for
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

CHANGELIST = reverse("admin:capabilities_job_changelist")


@pytest.fixture
def staff() -> Client:
    return client_for(staff=True)


def jobs_in_every_status(session: AgentSession) -> dict[str, Job]:
    now = timezone.now()
    base64_blob = "QUJD" * 10_000
    made = {}
    for status in JobStatus.values:
        made[status] = Job.objects.create(
            session=session,
            call_id=f"{status}-{uuid.uuid4().hex[:6]}",
            capability="process.image",
            params={"image": {"content": base64_blob, "encoding": "base64"}, "operations": []},
            status=status,
            progress=3 if status == JobStatus.RUNNING else None,
            progress_total=10 if status == JobStatus.RUNNING else None,
            stage="resize" if status == JobStatus.RUNNING else "",
            started_at=None if status == JobStatus.QUEUED else now - timedelta(seconds=2),
            settled_at=now if status not in (JobStatus.QUEUED, JobStatus.RUNNING) else None,
            stopped_at=now if status not in (JobStatus.QUEUED, JobStatus.RUNNING) else None,
            worker="w1@host:1" if status != JobStatus.QUEUED else "",
        )
    failed = made[JobStatus.FAILED]
    failed.error_code, failed.error_message = "OPERATION_FAILED", "boom"
    failed.error_traceback = "Traceback (most recent call last):\n  boom"
    failed.save()
    cancelled = made[JobStatus.CANCELLED]
    cancelled.cancel_source, cancelled.error_code = CancelSource.AGENT, "CANCELLED"
    cancelled.save()
    done = made[JobStatus.SUCCEEDED]
    name = default_storage.save(f"results/{done.id}/out.png", ContentFile(b"\x89PNG..."))
    done.result = {
        "image": {"$file": name, "mimeType": "image/png", "size": 7, "filename": "out.png"},
        "width": 3,
        "height": 2,
    }
    done.save()
    return made


def test_changelist_and_details_render_every_status(staff: Client) -> None:
    session = AgentSession.objects.create(agent_name="renderer", agent_version="2.0")
    made = jobs_in_every_status(session)
    page = staff.get(CHANGELIST, {"q": str(session.id)})
    assert page.status_code == 200
    html = page.content.decode()
    for job in made.values():
        assert job.call_id in html
    assert "Last hour" in html
    assert "QUJDQUJD" * 10 not in html
    for job in made.values():
        detail = staff.get(reverse("admin:capabilities_job_change", args=[job.pk]))
        assert detail.status_code == 200
        body = detail.content.decode()
        assert "40000 characters" in body  # the base64 input, summarised
        assert "QUJD" * 100 not in body
    failed = staff.get(reverse("admin:capabilities_job_change", args=[made["failed"].pk]))
    assert "Traceback (most recent call last)" in failed.content.decode()
    done = staff.get(reverse("admin:capabilities_job_change", args=[made["succeeded"].pk]))
    link = reverse("admin:capabilities_job_file", args=[made["succeeded"].pk, "image"])
    assert link in done.content.decode()
    file_response = staff.get(link)
    assert file_response.status_code == 200
    assert b"".join(file_response.streaming_content) == b"\x89PNG..."  # type: ignore[attr-defined]
    sessions = staff.get(reverse("admin:capabilities_agentsession_change", args=[session.pk]))
    assert sessions.status_code == 200
    assert made["running"].call_id in sessions.content.decode()
    listing = staff.get(
        reverse("admin:capabilities_agentsession_changelist"), {"q": str(session.id)}
    )
    assert "1 running" in listing.content.decode()


def test_changelist_queries_do_not_grow_with_the_page(staff: Client) -> None:
    few, many = (
        AgentSession.objects.create(agent_name="few"),
        AgentSession.objects.create(agent_name="many"),
    )
    for session, count in ((few, 3), (many, 45)):
        Job.objects.bulk_create(
            Job(session=session, call_id=f"q{n}", capability="export.pdf", params={})
            for n in range(count)
        )
    staff.get(CHANGELIST)  # warm caches (content types, permissions)

    def queries_for(session: AgentSession) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(CHANGELIST, {"q": str(session.id)}).status_code == 200
        return len(captured)

    assert queries_for(few) == queries_for(many) <= 15


def test_non_staff_are_refused() -> None:
    for client in (client_for(staff=False), Client(HTTP_HOST="127.0.0.1")):
        response = client.get(CHANGELIST)
        assert response.status_code == 302
        assert "/admin/login/" in response["Location"]


def test_cancel_action_reaches_the_agent_and_stops_the_worker(staff: Client, agent: Agent) -> None:
    call = agent.call("test.sleep", {"steps": 500, "stepMs": 20}, call_id="ops")
    job = wait_running(agent, "ops")
    response = staff.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert response.status_code == 302
    payload = agent.result_of(call)["payload"]
    assert payload["cancelled"] is True
    assert payload["error"]["code"] == "CANCELLED"
    stopped = eventually(Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first)
    assert stopped.cancel_source == CancelSource.OPERATOR
    assert "in the admin" in stopped.cancel_reason
    assert not stopped.hard_killed


def test_admin_cannot_add_change_or_delete_jobs(staff: Client) -> None:
    job = Job.objects.create(
        session=AgentSession.objects.create(), call_id="ro", capability="export.pdf", params={}
    )
    assert staff.get(reverse("admin:capabilities_job_add")).status_code == 403
    assert staff.get(reverse("admin:capabilities_job_delete", args=[job.pk])).status_code == 403
    change = staff.post(reverse("admin:capabilities_job_change", args=[job.pk]), {"stage": "x"})
    assert change.status_code == 403


def test_dev_superuser_only_in_debug() -> None:
    with pytest.raises(CommandError):
        call_command("ensure_dev_superuser")
    with override_settings(DEBUG=True, DEV_SUPERUSER_USERNAME="dev-admin"):
        call_command("ensure_dev_superuser")
        call_command("ensure_dev_superuser")  # idempotent
    assert get_user_model().objects.get(username="dev-admin").is_superuser
