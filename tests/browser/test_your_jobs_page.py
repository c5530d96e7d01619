""" "Your jobs" in Chromium: a user signs in, sees the job their agent runs, live, and
cancels it with its button; the agent is told it was cancelled by "user" (screenshot kept)."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

from capabilities.access import agent_keys
from capabilities.models import CancelSource, Job, JobStatus
from tests.browser.conftest import screenshot
from tests.browser.support import orm, orm_eventually
from tests.support.agent import Agent
from tests.support.stack import Stack
from tests.support.user_jobs import new_user

LONG = {"mode": "checkpoint", "steps": 1500, "stepMs": 20}


def _user_and_key() -> tuple[Any, str]:
    user = new_user()
    return user, agent_keys.create_key("browser agent", owner=user)[1]


def test_a_signed_in_user_cancels_their_running_job_with_the_button(
    page: Page, stack: Stack
) -> None:
    user, key = orm(_user_and_key)
    with Agent(stack.ws_url, key=key) as agent:
        agent.initialize()
        call = agent.call("test.sleep", LONG, call_id="seen-in-the-browser")
        job: Job = orm_eventually(
            lambda: Job.objects.filter(
                session_id=agent.session_id, status=JobStatus.RUNNING
            ).first()
        )

        # Signed out, the page sends the browser to the sign-in form, then back.
        page.goto(f"{stack.http_url}/abp/jobs/")
        assert "/accounts/login/" in page.url
        page.fill("#id_username", user.get_username())
        page.fill("#id_password", "x")
        page.click("button[type=submit]")
        page.wait_for_url(f"{stack.http_url}/abp/jobs/")

        row = page.locator(f'tr[data-job-id="{job.id}"]')
        page.locator(f'tr[data-job-id="{job.id}"][data-status="running"]').wait_for()
        assert "test.sleep" in row.inner_text()
        # Live: its progress moves while the page is open.
        page.wait_for_function(
            """(id) => {
              const bar = document.querySelector(`tr[data-job-id="${id}"] progress`);
              return bar !== null && Number(bar.value) > 1;
            }""",
            arg=str(job.id),
        )
        screenshot(page, "your-jobs-running")
        row.get_by_role("button", name="Cancel").click()
        page.locator(f'tr[data-job-id="{job.id}"][data-status="cancelled"]').wait_for()
        assert "by user" in row.inner_text()
        assert row.get_by_role("button", name="Cancel").count() == 0
        assert page.locator("#abp-jobs-problem").is_hidden()

        payload = agent.result_of(call)["payload"]
        assert payload["cancelled"] is True
        assert payload["error"]["details"] == {"source": "user"}
        stopped = orm_eventually(
            lambda: Job.objects.filter(pk=job.id, stopped_at__isnull=False).first()
        )
        assert stopped.cancel_source == CancelSource.USER
        assert len(agent.results_for_call("seen-in-the-browser")) == 1
