"""A call frame lost as the socket drops is sent again on resume: `window.abp` and the bridge.

Playwright stands between the page and the app's WebSocket: it swallows the one call
frame named, then closes the socket (1012, a restart: resumable) without passing the
frame on. The page resumes; the resume's `heldCalls` does not list the call, so the
page sends it again, marked `resent` (docs/protocol.md, resuming a session).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

import pytest
from playwright.sync_api import Page, WebSocketRoute

from capabilities.models import Job, JobStatus
from tests.browser.support import orm_eventually
from tests.browser.test_resume_pages import AGENT, INITIALIZE, call_results_on_the_wire
from tests.support.stack import Stack

SHORT_CALL = (
    """([callId, echo]) => window.client.call("test.sleep", { steps: 1, echo }, { callId })"""
)


@dataclass
class LossySocket:
    """Loses the call frame with callId `lose`, once, and drops the socket it was sent on."""

    lose: str | None = None
    lost: list[str] = field(default_factory=list)
    sockets: int = 0
    resent: list[str] = field(default_factory=list)

    def route(self, ws: WebSocketRoute) -> None:
        self.sockets += 1
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            call = _call_in(message)
            if call is not None and call[0] == self.lose:
                self.lose = None
                self.lost.append(call[0])
                ws.close(code=1012, reason="the network lost a frame")
                server.close()
                return
            if call is not None and call[1]:
                self.resent.append(call[0])
            server.send(message)

        ws.on_message(from_page)


def _call_in(message: str | bytes) -> tuple[str, bool] | None:
    """(callId, resent) of a call frame; None for anything else."""
    try:
        envelope = json.loads(message)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or envelope.get("type") != "capabilities/call":
        return None
    options = (envelope.get("payload") or {}).get("options") or {}
    return str(options.get("callId")), options.get("resent") is True


@pytest.fixture
def lossy(page: Page) -> LossySocket:
    """Every WebSocket the page (or its iframes) opens to the app goes through it."""
    relay = LossySocket()
    page.route_web_socket(re.compile(r"/abp/ws"), relay.route)
    return relay


def one_job(session_id: uuid.UUID | str, call_id: str) -> Job:
    session = uuid.UUID(str(session_id))
    jobs = orm_eventually(
        lambda: list(Job.objects.filter(session_id=session, call_id=call_id)) or None
    )
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_window_abp_sends_a_call_lost_with_the_socket_again(
    lossy: LossySocket, page: Page, stack: Stack
) -> None:
    results = call_results_on_the_wire(page)
    page.goto(f"{stack.http_url}/")
    session_id = page.evaluate(INITIALIZE, AGENT)
    page.evaluate("() => { window.client = abp; }")
    lossy.lose = "page-lost"
    answer = page.evaluate(SHORT_CALL, ["page-lost", "recovered"])
    assert answer["success"] is True, answer
    assert answer["data"]["echo"] == "recovered"
    assert lossy.lost == ["page-lost"]
    assert lossy.resent == ["page-lost"]
    assert lossy.sockets >= 2
    assert [r["callId"] for r in results].count("page-lost") == 1
    assert page.evaluate("() => abp.sessionId") == session_id
    assert one_job(session_id, "page-lost").status == JobStatus.SUCCEEDED
    # A call the app did get is not sent again when the socket drops after it.
    lossy.lose = "trigger"
    page.evaluate(SHORT_CALL, ["trigger", "second drop"])
    assert lossy.resent == ["page-lost", "trigger"]
    assert one_job(session_id, "trigger").status == JobStatus.SUCCEEDED
    page.evaluate("() => abp.shutdown()")


def test_the_bridge_sends_a_call_lost_with_the_socket_again(
    lossy: LossySocket, page: Page, parent: uuid.UUID
) -> None:
    lossy.lose = "bridge-lost"
    answer = page.evaluate(SHORT_CALL, ["bridge-lost", "through the bridge"])
    assert answer["success"] is True, answer
    assert answer["data"]["echo"] == "through the bridge"
    assert lossy.lost == ["bridge-lost"]
    assert lossy.resent == ["bridge-lost"]
    traffic = page.evaluate("() => window.traffic")
    assert traffic.count(["in", "capabilities/call-result"]) == 1
    assert traffic.count(["in", "initialize-result"]) == 1  # the resume's stayed in the bridge
    assert one_job(parent, "bridge-lost").status == JobStatus.SUCCEEDED
