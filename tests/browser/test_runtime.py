"""`window.abp` on the app page, driven the way the spec's reference client drives it."""

from __future__ import annotations

import base64
import json
import urllib.request
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

from playwright.sync_api import Page

from capabilities.endings import resumption
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from capabilities.protocol.replies import NOT_FOUND
from capabilities.work import registry
from tests.browser.conftest import screenshot
from tests.browser.support import orm, orm_eventually, until
from tests.support.stack import Stack

AGENT = {
    "agent": {"name": "reference-client", "version": "1.0"},
    "protocolVersion": "0.1",
    "features": {"notifications": True, "progress": True, "elicitation": False},
}


class HeadReader(HTMLParser):
    """The elements of <head>, in order, as (tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[dict[str, str | None]] = []
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "head":
            self._in_head = True
        elif self._in_head:
            self.head.append((tag, attributes))
        if tag == "script":
            self.scripts.append(attributes)

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self._in_head = False


def read_head(url: str) -> HeadReader:
    with urllib.request.urlopen(url, timeout=10) as response:
        reader = HeadReader()
        reader.feed(response.read().decode())
    return reader


def long_document(pages: int) -> str:
    section = "<section style='page-break-after: always'><h2>Part</h2><p>text</p></section>"
    return f"<html><body>{section * pages}</body></html>"


def test_the_server_rendered_head_links_the_manifest_and_loads_the_runtime_first(
    stack: Stack,
) -> None:
    head = read_head(f"{stack.http_url}/")
    first_tag, first = head.head[0]
    assert first_tag == "script"
    assert (first["src"] or "").endswith("/static/abp/runtime.js")
    # Synchronous: a classic script, neither deferred nor async.
    assert not {"async", "defer", "type"} & set(first)
    assert head.scripts[0] is first
    links = [
        attrs["href"]
        for tag, attrs in head.head
        if tag == "link" and attrs["rel"] == "abp-manifest"
    ]
    assert links == ["/abp.json"]


class Heard:
    """What an agent heard through a function it exposed to the page."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> None:
        self.payloads.append(payload)

    def about(self, operation_id: str) -> list[dict[str, Any]]:
        """The payloads about one call (progress) or operation (notifications)."""
        return [
            p
            for p in self.payloads
            if p.get("operationId", (p.get("data") or {}).get("operationId")) == operation_id
        ]


def discover(page: Page, stack: Stack) -> dict[str, Any]:
    """The spec's discovery: the page's head names the manifest; fetch it."""
    page.goto(f"{stack.http_url}/")
    href = page.get_attribute('head link[rel="abp-manifest"]', "href")
    assert href == "/abp.json"
    with urllib.request.urlopen(urljoin(page.url, href), timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"
        manifest: dict[str, Any] = json.load(response)
    assert manifest["abp"] == "0.1"
    return manifest


def check_capabilities(page: Page, manifest: dict[str, Any]) -> None:
    """After initialize: every capability of the manifest, available where this session
    may call it (an anonymous page may call none that needs a user's permission)."""
    listed = page.evaluate("() => abp.listCapabilities()")
    assert isinstance(listed, list)
    by_name = {item["name"]: item for item in listed}
    assert {spec["name"] for spec in manifest["capabilities"]} == set(by_name)
    guarded = {spec.name for spec in registry.all_specs() if spec.permissions}
    assert guarded
    for item in listed:
        assert set(item) == {"name", "description", "available", "inputSchema"}
        assert item["available"] is (item["name"] not in guarded), item["name"]
    assert by_name["export.pdf"]["inputSchema"]["type"] == "object"
    described = page.evaluate("() => abp.describeCapability('export.pdf')")
    assert "document" in json.dumps(described["outputSchema"])
    assert page.evaluate("() => abp.describeCapability('no.such')") is None
    supports = "() => Promise.all([abp.supports('export.pdf'), abp.supports('no.such')])"
    assert page.evaluate(supports) == [True, False]


def test_reference_client_flow(page: Page, stack: Stack) -> None:
    # What a Puppeteer or Playwright agent does to hear progress and notifications.
    progress, notifications = Heard(), Heard()
    page.expose_function("__abp_progress", progress)
    page.expose_function("__abp_notification", notifications)
    manifest = discover(page, stack)
    page.wait_for_function("() => typeof window.abp === 'object'")
    assert page.evaluate("() => [abp.protocolVersion, abp.app.id, abp.initialized]") == [
        "0.1",
        manifest["app"]["id"],
        False,
    ]

    session = page.evaluate("params => abp.initialize(params)", AGENT)
    assert session["protocolVersion"] == "0.1"
    assert page.evaluate("() => [abp.initialized, abp.sessionId]") == [True, session["sessionId"]]
    check_capabilities(page, manifest)

    # A call that finishes.
    result = page.evaluate(
        "() => abp.call('export.pdf', {html: '<h1>Report</h1>', options: {pageSize: 'letter'}})"
    )
    assert result["success"] is True, result
    assert result["data"]["pageCount"] == 1
    assert base64.b64decode(result["data"]["document"]["content"]).startswith(b"%PDF")
    assert until(page, lambda: progress.about(result["callId"]))

    # A call cancelled while it runs, with window.abp.cancel.
    page.evaluate(
        "html => { window.longCall = abp.call('export.pdf', {html}, {callId: 'long-pdf'}); }",
        long_document(300),
    )
    first = until(page, lambda: progress.about("long-pdf"))
    assert {"progress", "total", "percentage", "stage", "status"} <= set(first[0])
    screenshot(page, "runtime-reference-client")
    confirmation = page.evaluate("() => abp.cancel('long-pdf', 'changed my mind')")
    assert confirmation == {"callId": "long-pdf", "cancelled": True}
    cancelled = page.evaluate("() => window.longCall")
    assert (cancelled["success"], cancelled["cancelled"]) == (False, True)
    assert cancelled["error"]["code"] == "CANCELLED"
    # Idempotent, in the object form too.
    again = page.evaluate("() => abp.cancel({callId: 'long-pdf', reason: 'twice'})")
    assert again["cancelled"] is True
    job = orm_eventually(
        Job.objects.filter(call_id="long-pdf", stopped_at__isnull=False).first, timeout=15
    )
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    assert job.cancel_reason == "changed my mind"
    events = {n["event"] for n in notifications.about("long-pdf")}
    assert "notifications/operation/started" in events

    # Shutdown: the call still in flight is answered, cancelled, before the socket closes.
    page.evaluate(
        "() => { window.sleeper = abp.call('test.sleep', {steps: 500, stepMs: 20}, "
        "{callId: 'sleeper'}); }"
    )
    until(page, lambda: progress.about("sleeper"))
    page.evaluate("() => abp.shutdown({reason: 'done'})")
    assert page.evaluate("() => window.sleeper")["cancelled"] is True
    assert page.evaluate("() => [abp.initialized, abp.sessionId]") == [False, None]
    closed = orm(lambda: AgentSession.objects.get(id=session["sessionId"]))
    assert closed.close_reason == "shutdown: done"
    sleeper_job = orm(lambda: Job.objects.get(session=closed, call_id="sleeper"))
    assert sleeper_job.cancel_source == CancelSource.SHUTDOWN


def test_runtime_refusals_and_an_already_aborted_signal(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    before = page.evaluate("() => abp.call('test.sleep', {steps: 1})")
    assert before["error"]["code"] == "NOT_INITIALIZED"
    assert page.evaluate("() => abp.cancel('x')")["error"]["code"] == "NOT_INITIALIZED"
    page.evaluate("params => abp.initialize(params)", AGENT)
    error = page.evaluate("params => abp.initialize(params).then(() => null, e => e.code)", AGENT)
    assert error == "ALREADY_INITIALIZED"

    aborted = page.evaluate(
        "() => abp.call('test.sleep', {steps: 1}, "
        "{callId: 'never-sent', signal: AbortSignal.abort('not wanted')})"
    )
    assert aborted["cancelled"] is True
    assert aborted["error"]["code"] == "CANCELLED"
    assert aborted["error"]["message"] == "not wanted"
    assert not orm(Job.objects.filter(call_id="never-sent").exists)

    unknown = page.evaluate("() => abp.cancel('no-such-call')")
    assert unknown == {"callId": "no-such-call", "cancelled": False, "reason": NOT_FOUND}
    page.evaluate("() => abp.shutdown()")


def test_a_dropped_socket_settles_every_pending_call(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    # Progress and notifications on: frames are on their way while the socket closes,
    # and the consumer must still run its disconnect (it once raised on such a send).
    loud = {**AGENT, "features": {"notifications": True, "progress": True}}
    page.evaluate("params => abp.initialize(params)", loud)
    page.evaluate(
        # Longer than the session's grace period and the reaper's pass after it: the
        # call is still running when the session ends (10 s of work raced it).
        "() => { window.pending = abp.call('test.sleep', {steps: 2000, stepMs: 20}, "
        "{callId: 'pending'}); }"
    )
    orm_eventually(Job.objects.filter(call_id="pending", status=JobStatus.RUNNING).exists)
    # A frame over the server's limit (1 MiB in the tests): the server closes (1009).
    oversized = page.evaluate(
        "() => abp.call('test.sleep', {echo: 'x'.repeat(1100000)}, {callId: 'oversized'})"
    )
    pending = page.evaluate("() => window.pending")
    for response in (oversized, pending):
        assert response["success"] is False
        assert response["error"]["code"] == "DISCONNECTED"
        assert response["error"]["retryable"] is True
    assert pending["callId"] == "pending"
    assert page.evaluate("() => abp.initialized") is False
    # 1009 is not resumed: the server ends the session once its grace period passes.
    job = orm_eventually(
        Job.objects.filter(call_id="pending", status=JobStatus.CANCELLED).first,
        timeout=resumption.grace().total_seconds() + 20,
    )
    assert job.cancel_source == CancelSource.DISCONNECT
