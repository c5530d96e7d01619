"""Large binary inputs from a browser are uploaded, not sent as base64 (docs/uploads.md).

`window.abp` (client.js over the WebSocket, with the page token) and the embed bridge
(an ArrayBuffer posted by a page of another site) both upload an image of 64 KiB or
more to /abp/uploads and name it in the call; the job's row holds the reference only.
"""

from __future__ import annotations

import uuid
from typing import Any

from playwright.sync_api import Page

from capabilities.models import Job
from tests.browser.conftest import CONNECT, ParentSite, open_parent
from tests.browser.support import orm
from tests.support.stack import Stack

# A noisy 600x400 PNG (~700 KB: over the upload threshold), resized in the call.
CALL_WITH_A_LARGE_BUFFER = """async (call) => {
  const canvas = new OffscreenCanvas(600, 400);
  const context = canvas.getContext("2d");
  const pixels = context.createImageData(600, 400);
  for (let i = 0; i < pixels.data.length; i++) pixels.data[i] = (i * 2654435761) >>> 24;
  context.putImageData(pixels, 0, 0);
  const png = await (await canvas.convertToBlob({ type: "image/png" })).arrayBuffer();
  const result = await call({
    image: { content: png, mimeType: "image/png" },
    operations: [{ type: "resize", width: 60, height: 40 }],
    format: "jpeg",
  });
  return { bytes: png.byteLength, success: result.success, error: result.error ?? null,
           size: result.success ? [result.data.width, result.data.height] : null,
           callId: result.callId };
}"""


def _stored_image(call_id: str) -> dict[str, Any]:
    image: dict[str, Any] = orm(lambda: Job.objects.get(call_id=call_id).params["image"])
    return image


def test_window_abp_uploads_a_large_array_buffer(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    agent = "{agent: {name: 'uploader', version: '1'}, protocolVersion: '0.1'}"
    page.evaluate(f"() => window.abp.initialize({agent})")
    outcome = page.evaluate(
        f"() => ({CALL_WITH_A_LARGE_BUFFER})((params) => window.abp.call('process.image', params))"
    )
    assert outcome["bytes"] > 64 * 1024
    assert outcome["success"] is True, outcome
    assert outcome["size"] == [60, 40]
    stored = _stored_image(outcome["callId"])
    assert "uploadId" in stored
    assert "content" not in stored
    assert stored["size"] == outcome["bytes"]


def test_the_bridge_uploads_a_large_array_buffer(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    open_parent(page, parent_site.url(parent_site.allowed, "parent.html", app=stack.http_url))
    uuid.UUID(page.evaluate(CONNECT, stack.http_url))
    outcome = page.evaluate(
        f"() => ({CALL_WITH_A_LARGE_BUFFER})("
        "(params) => window.client.call('process.image', params))"
    )
    assert outcome["success"] is True, outcome
    assert outcome["size"] == [60, 40]
    stored = _stored_image(outcome["callId"])
    assert "uploadId" in stored
    assert stored["mimeType"] == "image/png"
