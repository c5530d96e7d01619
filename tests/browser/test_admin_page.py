"""The jobs changelist as an operator sees it, in Chromium (screenshot kept)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import Page

from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.browser.conftest import screenshot
from tests.browser.support import orm
from tests.support.stack import Stack


def _operator_and_jobs() -> tuple[str, str]:
    name = f"operator-{uuid.uuid4().hex[:6]}"
    get_user_model().objects.create_superuser(username=name, email="", password="pw-for-tests")
    session = AgentSession.objects.create(agent_name="report-bot", agent_version="1.4")
    now = timezone.now()
    rows = [
        (JobStatus.RUNNING, "export.pdf", 37, None, "layout", ""),
        (JobStatus.QUEUED, "process.image", None, None, "", ""),
        (JobStatus.SUCCEEDED, "export.pdf", 12, 12, "write", ""),
        (JobStatus.CANCELLED, "process.image", 2, 4, "blur", CancelSource.AGENT),
        (JobStatus.FAILED, "convert.markdownToHtml", None, None, "", ""),
    ]
    for n, (status, capability, progress, total, stage, source) in enumerate(rows):
        created = now - timedelta(seconds=30 * (n + 1))
        active = status in (JobStatus.QUEUED, JobStatus.RUNNING)
        Job.objects.create(
            session=session,
            call_id=f"call-{n}",
            capability=capability,
            params={},
            status=status,
            progress=progress,
            progress_total=total,
            stage=stage,
            cancel_source=source,
            created_at=created,
            started_at=None if status == JobStatus.QUEUED else created + timedelta(seconds=1),
            settled_at=None if active else created + timedelta(seconds=4),
            stopped_at=None if active else created + timedelta(seconds=4),
            worker="" if status == JobStatus.QUEUED else "celery@host:4242",
        )
    return name, str(session.id)


def test_operator_sees_the_jobs_changelist(page: Page, stack: Stack) -> None:
    username, session_id = orm(_operator_and_jobs)
    page.set_viewport_size({"width": 1700, "height": 900})
    page.goto(f"{stack.http_url}/admin/login/?next=/admin/capabilities/job/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw-for-tests")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    page.goto(f"{stack.http_url}/admin/capabilities/job/?q={session_id}")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 5
    text = page.inner_text("#content")
    assert "Last hour" in text
    for label in ("Running", "Queued", "Succeeded", "Cancelled", "Failed"):
        assert label in text
    assert page.locator("option", has_text="Cancel selected jobs").count() == 1
    screenshot(page, "admin-changelist")
