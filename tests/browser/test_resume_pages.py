"""The browser side resumes: `window.abp` and the /abp/embed/ bridge after a dropped socket.

The socket is dropped for real: the stack's Daphne is killed by PID (no close frame,
no disconnect handler) and started again on the same port.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import Page, WebSocket

from capabilities.endings import resumption
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.browser.conftest import START_SLEEPER
from tests.browser.support import orm, orm_eventually
from tests.support.stack import Stack

AGENT = {
    "agent": {"name": "resuming-page", "version": "1.0"},
    "protocolVersion": "0.1",
    "features": {"notifications": False, "progress": True},
}
INITIALIZE = "params => abp.initialize(params).then((session) => session.sessionId)"
SLEEPER = {"steps": 300, "stepMs": 20}  # about 6 s, longer than a Daphne restart here


def call_results_on_the_wire(page: Page) -> list[dict[str, object]]:
    """Every call-result any socket of the page receives, as it arrives."""
    seen: list[dict[str, object]] = []

    def on_frame(payload: str | bytes) -> None:
        message = json.loads(payload)
        if message.get("type") == "capabilities/call-result":
            seen.append(message["payload"])

    def on_socket(socket: WebSocket) -> None:
        socket.on("framereceived", on_frame)

    page.on("websocket", on_socket)
    return seen


def restart_daphne(stack: Stack) -> None:
    stack.web.kill()  # SIGKILL by PID: the browser sees 1006
    stack.start_web()


def start_sleeper(page: Page, call_id: str) -> Job:
    page.evaluate(
        "([callId, params]) => { window.result = abp.call('test.sleep', params, {callId}); }",
        [call_id, SLEEPER],
    )
    return orm_eventually(
        Job.objects.filter(call_id=call_id, status=JobStatus.RUNNING).first, timeout=30
    )


def test_window_abp_resumes_its_session_after_daphne_restarts(page: Page, stack: Stack) -> None:
    results = call_results_on_the_wire(page)
    page.goto(f"{stack.http_url}/")
    session_id = page.evaluate(INITIALIZE, AGENT)
    start_sleeper(page, "survives-restart")
    restart_daphne(stack)
    # A call made while the socket is down waits for the resumed one.
    page.evaluate(
        "() => { window.during = abp.call('convert.markdownToHtml', {markdown: '# back'}); }"
    )
    survived = page.evaluate("() => window.result")
    assert survived["success"] is True, survived
    assert page.evaluate("() => window.during")["data"]["html"].startswith("<h1")
    assert [r["callId"] for r in results].count("survives-restart") == 1
    assert page.evaluate("() => [abp.initialized, abp.sessionId]") == [True, session_id]
    session = orm(lambda: AgentSession.objects.get(pk=session_id))
    assert session.generation >= 1
    assert session.closed_at is None
    job = orm(lambda: Job.objects.get(session_id=session_id, call_id="survives-restart"))
    assert job.status == JobStatus.SUCCEEDED
    page.evaluate("() => abp.shutdown()")


def test_window_abp_reports_disconnected_once_the_session_cannot_be_resumed(
    page: Page, stack: Stack
) -> None:
    page.goto(f"{stack.http_url}/")
    session_id = page.evaluate(INITIALIZE, AGENT)
    start_sleeper(page, "outlived")
    stack.web.kill()
    # The grace period passes while the app is down: the reaper ends the session.
    orm(
        lambda: AgentSession.objects.filter(pk=session_id).update(
            seen_at=timezone.now() - timedelta(hours=1)
        )
    )
    orm(resumption.expire_abandoned)
    stack.start_web()
    ended = page.evaluate("() => window.result")
    assert ended["success"] is False
    assert ended["error"]["code"] == "DISCONNECTED"
    assert ended["error"]["retryable"] is True
    assert "SESSION_EXPIRED" in ended["error"]["message"]
    assert page.evaluate("() => abp.initialized") is False
    job = orm_eventually(
        Job.objects.filter(call_id="outlived", session_id=session_id)
        .exclude(status=JobStatus.RUNNING)
        .first
    )
    assert job.cancel_source == CancelSource.DISCONNECT


def test_a_page_that_goes_away_ends_its_session_at_once(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    session_id = page.evaluate(INITIALIZE, AGENT)
    start_sleeper(page, "page-left")
    page.goto("about:blank")
    job = orm_eventually(Job.objects.filter(call_id="page-left", status=JobStatus.CANCELLED).first)
    # Ended by the page's own shutdown, not by a reaper after the grace period.
    assert job.cancel_source == CancelSource.SHUTDOWN
    session = orm(lambda: AgentSession.objects.get(pk=session_id))
    assert session.close_reason.startswith("shutdown")


def test_the_bridge_resumes_its_session_after_daphne_restarts(
    page: Page, parent: uuid.UUID, stack: Stack
) -> None:
    page.evaluate(START_SLEEPER, "bridge-survives")
    page.wait_for_function("() => window.progress.length > 0")
    restart_daphne(stack)
    survived = page.evaluate("() => window.result")
    assert survived["success"] is True, survived
    traffic = page.evaluate("() => window.traffic")
    assert traffic.count(["in", "capabilities/call-result"]) == 1
    # The resume's own initialize-result stayed in the bridge.
    assert traffic.count(["in", "initialize-result"]) == 1
    assert page.evaluate("() => window.client.closed") is False
    again = page.evaluate(
        "() => window.client.call('convert.markdownToHtml', {markdown: '# still here'})"
    )
    assert again["success"] is True
    session = orm(lambda: AgentSession.objects.get(pk=parent))
    assert session.generation >= 1
    job = orm(lambda: Job.objects.get(session_id=parent, call_id="bridge-survives"))
    assert job.status == JobStatus.SUCCEEDED
