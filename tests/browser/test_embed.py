"""The iframe path: a page on another origin embeds /abp/embed/ and calls it with client.js."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.browser.conftest import START_SLEEPER, ParentSite, open_parent, screenshot
from tests.browser.support import orm, orm_eventually
from tests.support.stack import Stack


def test_abort_from_the_parent_cancels_the_job(page: Page, parent: uuid.UUID, stack: Stack) -> None:
    page.evaluate(START_SLEEPER, "from-parent")
    page.wait_for_function("() => window.progress.length >= 2")
    screenshot(page, "embed-parent-running")
    page.evaluate("() => window.controller.abort('parent changed its mind')")
    result = page.evaluate("() => window.result")
    assert result["callId"] == "from-parent"
    assert result["cancelled"] is True
    assert result["error"]["code"] == "CANCELLED"
    traffic = page.evaluate("() => window.traffic")
    assert ["out", "capabilities/cancel"] in traffic
    assert ["in", "capabilities/cancel-result"] in traffic

    # The cancel went hop by hop to the job, and the worker stopped.
    job = orm_eventually(
        Job.objects.filter(call_id="from-parent", stopped_at__isnull=False).first, timeout=15
    )
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "parent changed its mind"
    # The bridge's socket is the app's own page talking to the app.
    session = orm(lambda: AgentSession.objects.get(id=parent))
    assert session.origin == stack.http_url


def test_timeout_and_an_already_aborted_signal(page: Page, parent: uuid.UUID) -> None:
    outcome: dict[str, Any] = page.evaluate(
        """async () => {
          const sent = [];
          const stop = window.client.onEnvelope((d, m) => { if (d === "out") sent.push(m.type); });
          const aborted = await window.client.call("test.sleep", { steps: 1 }, {
            callId: "pre-aborted", signal: AbortSignal.abort("too late"),
          });
          const sentForAborted = sent.length;
          const timedOut = await window.client.call("test.sleep", { steps: 500, stepMs: 20 }, {
            callId: "timed-out", timeout: 400,
          });
          stop();
          return { aborted, sentForAborted, timedOut, sent };
        }"""
    )
    assert outcome["sentForAborted"] == 0
    assert outcome["aborted"]["cancelled"] is True
    assert outcome["aborted"]["error"]["message"] == "too late"
    assert outcome["timedOut"]["cancelled"] is True
    assert outcome["sent"] == ["capabilities/call", "capabilities/cancel"]
    assert not orm(Job.objects.filter(call_id="pre-aborted").exists)
    job = orm(lambda: Job.objects.get(session_id=parent, call_id="timed-out"))
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "Timed out after 400 ms."


def test_binary_in_and_out_as_array_buffers(page: Page, parent: uuid.UUID) -> None:
    outcome: dict[str, Any] = page.evaluate(
        """async () => {
          const canvas = new OffscreenCanvas(64, 48);
          const context = canvas.getContext("2d");
          context.fillStyle = "#c03030";
          context.fillRect(0, 0, 64, 48);
          const png = await (await canvas.convertToBlob({ type: "image/png" })).arrayBuffer();
          const image = await window.client.call("process.image", {
            image: { content: png, mimeType: "image/png" },
            operations: [{ type: "grayscale" }, { type: "rotate", degrees: 90 }],
            format: "png",
          }, { binary: "arraybuffer" });
          // Over the inline limit: a download URL, which the bridge fetches for us.
          const file = await window.client.call("test.sleep", { steps: 0, fileBytes: 300000 }, {
            binary: "arraybuffer",
          });
          const plain = await window.client.call("process.image", {
            image: { content: new Uint8Array(png), mimeType: "image/png" }, operations: [],
          });
          const out = image.data.image;
          return {
            inputBytes: png.byteLength,
            success: image.success,
            isBuffer: out.content instanceof ArrayBuffer,
            encoding: out.encoding,
            magic: Array.from(new Uint8Array(out.content, 0, 4)),
            size: [image.data.width, image.data.height],
            fileIsBuffer: file.data.file.content instanceof ArrayBuffer,
            fileBytes: file.data.file.content.byteLength,
            fileHasUrl: "downloadUrl" in file.data.file,
            plainEncoding: plain.data.image.encoding,
            plainIsText: typeof plain.data.image.content === "string",
          };
        }"""
    )
    assert outcome["success"] is True
    assert outcome["isBuffer"] is True
    assert outcome["encoding"] == "arraybuffer"
    assert outcome["magic"] == [0x89, 0x50, 0x4E, 0x47]
    assert outcome["size"] == [48, 64]
    assert outcome["fileIsBuffer"] is True
    assert outcome["fileBytes"] == 300000
    assert outcome["fileHasUrl"] is False
    # Without the option, results stay as the wire has them.
    assert outcome["plainEncoding"] == "base64"
    assert outcome["plainIsText"] is True


def test_malformed_messages_get_coded_errors(page: Page, parent: uuid.UUID, stack: Stack) -> None:
    replies: list[dict[str, Any]] = page.evaluate(
        """async (app) => {
          const frame = document.getElementById("bridge");
          const got = [];
          window.addEventListener("message", (event) => {
            if (event.source === frame.contentWindow) got.push(event.data);
          });
          const post = (message) => frame.contentWindow.postMessage(message, app);
          post(42);
          post("{not json");
          post({ type: "capabilities/call", id: "bigint", payload: { capability: "test.sleep",
                 params: { echo: 10n } } });
          post({ type: "abp-bridge/nonsense", id: "n" });
          post({ type: "capabilities/call", id: "huge", payload: { capability: "test.sleep",
                 params: { echo: "x".repeat(1100000) } } });
          post({ type: "bogus", id: "b", payload: {} });
          post({ type: "capabilities/call", id: "after", payload: { capability: "test.sleep",
                 params: { steps: 0, echo: "still here" } } });
          while (!got.some((m) => m.id === "after")) await new Promise((r) => setTimeout(r, 20));
          return got;
        }""",
        stack.http_url,
    )
    errors = [
        (m["type"], m["payload"].get("event"), (m["payload"].get("data") or {}).get("code"))
        for m in replies
        if m["type"] == "notification"
    ]
    assert errors[:2] == [("notification", "notifications/error", "PARSE_ERROR")] * 2
    assert ("notification", "notifications/error", "UNKNOWN_MESSAGE_TYPE") in errors
    by_id = {m["id"]: m for m in replies if m["type"] == "capabilities/call-result"}
    assert by_id["bigint"]["payload"]["error"]["code"] == "PARSE_ERROR"
    huge = by_id["huge"]["payload"]
    assert huge["error"]["code"] == "INVALID_PARAMS"
    assert huge["error"]["details"]["limit"] == 1024 * 1024
    unknown = [m for m in replies if (m["payload"].get("data") or {}).get("requestId") == "b"]
    assert unknown[0]["payload"]["data"]["code"] == "UNKNOWN_MESSAGE_TYPE"
    # The oversized message never reached the socket: the session lives on.
    assert by_id["after"]["payload"]["data"]["echo"] == "still here"


def test_a_parent_that_goes_away_cancels_its_calls(page: Page, parent: uuid.UUID) -> None:
    page.evaluate(START_SLEEPER, "left-behind")
    orm_eventually(Job.objects.filter(call_id="left-behind", status=JobStatus.RUNNING).exists)
    page.goto("about:blank")
    job = orm_eventually(
        Job.objects.filter(call_id="left-behind", status=JobStatus.CANCELLED).first
    )
    # Cancelled by the bridge's own cancel, not only by the socket closing.
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "The embedding page went away."


def test_a_parent_that_removes_the_iframe_or_detaches(page: Page, parent: uuid.UUID) -> None:
    page.evaluate(START_SLEEPER, "iframe-removed")
    page.wait_for_function("() => window.progress.length > 0")
    page.evaluate("() => document.getElementById('bridge').remove()")
    removed = page.evaluate("() => window.result")
    assert removed["error"]["code"] == "DISCONNECTED"
    assert removed["error"]["retryable"] is True
    job = orm_eventually(
        Job.objects.filter(call_id="iframe-removed", status=JobStatus.CANCELLED).first
    )
    assert job.cancel_source == CancelSource.AGENT


def test_detach_cancels_the_calls(page: Page, parent: uuid.UUID) -> None:
    page.evaluate(START_SLEEPER, "detached")
    page.wait_for_function("() => window.progress.length > 0")
    closed = page.evaluate("() => { window.client.close(); return window.result; }")
    assert closed["cancelled"] is True
    job = orm_eventually(Job.objects.filter(call_id="detached", status=JobStatus.CANCELLED).first)
    assert job.cancel_reason == "The parent detached."


def test_a_parent_on_a_disallowed_origin_gets_no_answer(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    open_parent(page, parent_site.url(parent_site.disallowed, "parent.html", app=stack.http_url))
    outcome: dict[str, Any] = page.evaluate(
        """async (app) => {
          const frame = document.getElementById("bridge");
          const replies = [];
          window.addEventListener("message", (event) => replies.push(event.data));
          frame.contentWindow.postMessage({ type: "initialize", id: "1", payload: {} }, "*");
          try {
            const target = { window: frame.contentWindow, origin: app, timeout: 1500 };
            await window.abpClient.connect(target);
            return { connected: true, replies: replies.length };
          } catch (error) {
            return { connected: false, code: error.code, replies: replies.length };
          }
        }""",
        stack.http_url,
    )
    assert outcome == {"connected": False, "code": "TRANSPORT_ERROR", "replies": 0}
    screenshot(page, "embed-disallowed-parent")


@pytest.mark.parametrize(
    ("origin", "why"),
    [("disallowed", "origin not allowed"), ("allowed", "not from the embedding page")],
)
def test_messages_from_other_frames_are_ignored(
    page: Page, parent: uuid.UUID, parent_site: ParentSite, origin: str, why: str
) -> None:
    # Another frame of the same page (an ad, a widget) reaches the bridge's window too.
    sender = getattr(parent_site, origin)
    page.evaluate(
        "url => { const f = document.createElement('iframe'); f.src = url; f.name = 'other';"
        " document.body.append(f); }",
        parent_site.url(sender, "blank.html"),
    )
    other = page.locator("iframe[name=other]").element_handle().content_frame()
    assert other is not None
    other.wait_for_url(parent_site.url(sender, "blank.html"))
    expected = f"ignored a message from {sender}: {why}"

    def ignored(message: ConsoleMessage) -> bool:
        return expected in message.text

    with page.expect_console_message(ignored, timeout=5000):
        other.evaluate(
            """() => {
              window.replies = [];
              window.addEventListener("message", (event) => window.replies.push(event.data));
              parent.frames["bridge"].postMessage({ type: "abp-bridge/hello", id: "h" }, "*");
            }"""
        )
    with pytest.raises(PlaywrightTimeout):
        other.wait_for_function("() => window.replies.length > 0", timeout=500)
