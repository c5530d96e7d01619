"""The demo page, used the way a person would: run jobs, watch them, cancel one."""

from __future__ import annotations

import io

from PIL import Image
from playwright.sync_api import FilePayload, Page

from capabilities.models import CancelSource, Job, JobStatus
from tests.browser.conftest import screenshot
from tests.browser.support import orm_eventually
from tests.support.stack import Stack


def photo() -> bytes:
    buffer = io.BytesIO()
    gradient = Image.linear_gradient("L").resize((480, 320))
    Image.merge("RGB", (gradient, gradient.transpose(Image.Transpose.ROTATE_180), gradient)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


def test_demo_runs_jobs_shows_progress_and_cancels(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    page.click("text=The demo")
    page.wait_for_selector("#connection[data-state=ready]")

    # A short PDF, previewed in the page.
    page.fill("input[name=pages]", "2")
    page.click("#pdf-form button[type=submit]")
    page.wait_for_selector(".job[data-status=succeeded] iframe.pdf")

    # An uploaded image, processed and shown.
    upload = FilePayload(name="photo.png", mimeType="image/png", buffer=photo())
    page.set_input_files("#image-file", files=[upload])
    page.select_option("select[name=operation]", "blur")
    page.click("#image-form button[type=submit]")
    picture = page.wait_for_selector(".job[data-status=succeeded] img.picture")
    page.wait_for_function("img => img.complete && img.naturalWidth === 480", arg=picture)

    # A long export: the progress bar moves, then Cancel stops it.
    page.fill("input[name=pages]", "300")
    page.click("#pdf-form button[type=submit]")
    job = page.locator(".job").first
    bar = job.locator("progress")
    bar.wait_for()
    page.wait_for_function("bar => bar.value > 0", arg=bar.element_handle())
    first = bar.evaluate("bar => bar.value")
    page.wait_for_function("([bar, first]) => bar.value > first", arg=[bar.element_handle(), first])
    call_id = job.get_attribute("data-call-id")
    screenshot(page, "demo-progress")
    job.locator(".job-cancel").click()
    page.wait_for_selector(f".job[data-call-id='{call_id}'][data-status=cancelled]")
    screenshot(page, "demo-cancelled")

    cancelled = orm_eventually(
        Job.objects.filter(call_id=call_id, stopped_at__isnull=False).first, timeout=15
    )
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.cancel_source == CancelSource.AGENT
    assert cancelled.cancel_reason == "Cancelled from the demo page."
    log = page.inner_text("#log")
    for message_type in ("capabilities/cancel", "capabilities/cancel-result", "progress"):
        assert message_type in log
