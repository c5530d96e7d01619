"""The browser door: a headless Chromium page on another origin that embeds the app's
bridge (/abp/embed/) and makes calls through it with the app's client.js, several at
once, some aborted at their moment (tests/browser/ drives the same pages).

client.js never rejects a call: it resolves with the call's one ABPResponse, a
cancelled one after an abort, an error one when the session could not be kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, async_playwright

from tests.support.soak import plan
from tests.support.soak.doors.lane import Lane
from tests.support.soak.doors.pending import settle
from tests.support.soak.ledger import Ledger, Op, names_call, outcome_of_error

DOOR = "browser"
PAGES = Path(__file__).resolve().parents[3] / "browser" / "pages"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PACE_SECONDS = 0.5  # mean time between a page's calls, each in flight until answered

CONNECT = """async (app) => {
  const frame = document.getElementById("bridge");
  const client = await window.abpClient.connect({ window: frame.contentWindow, origin: app });
  window.client = client;
  const session = await client.initialize({ agent: { name: "soak page", version: "1" } });
  return session.sessionId;
}"""

CALL = """async ({ capability, params, callId, cancelAfter }) => {
  const controller = new AbortController();
  if (cancelAfter !== null) setTimeout(() => controller.abort("soak cancel"), cancelAfter * 1000);
  return await window.client.call(capability, params, { callId, signal: controller.signal });
}"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def parent_server() -> ThreadingHTTPServer:
    """The embedding origin's server for tests/browser/pages/, bound to a free port now."""
    return ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(PAGES)))


@contextlib.contextmanager
def parent_site(server: ThreadingHTTPServer) -> Iterator[str]:
    """The bound server, serving while the lane runs (its owner closes its socket)."""
    thread = threading.Thread(target=server.serve_forever, name="soak-parent-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


async def lane(app: str, server: ThreadingHTTPServer, ctx: Lane) -> None:
    """One page making calls until the stop; a fresh page if its session is lost."""
    with parent_site(server) as parent:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                while not ctx.stop.is_set():
                    page = await browser.new_page()
                    try:
                        await _calls(page, f"{parent}/parent.html?app={app}", app, ctx)
                    except PlaywrightError as failed:
                        ctx.ledger.count(DOOR, f"pages failed: {str(failed)[:60]}")
                    finally:
                        await page.close()
                    if not ctx.stop.is_set():
                        await asyncio.sleep(1.0)
            finally:
                await browser.close()


async def _calls(page: Page, url: str, app: str, ctx: Lane) -> None:
    """Open the parent page, connect through the bridge, call (several at once) until the
    stop or the session's loss; then wait for the calls still out."""
    ledger = ctx.ledger
    await page.goto(url)
    await page.wait_for_function("() => window.parentReady === true", timeout=30000)
    session = await page.evaluate(CONNECT, app)
    ledger.count(DOOR, "sessions")
    lost = asyncio.Event()
    calls: dict[asyncio.Task[None], Op] = {}
    while not ctx.stop.is_set() and not lost.is_set():
        planned = plan.next_call(ctx.rng, ctx.mix)
        op = ledger.new(DOOR, planned.capability, planned.cancel_plan, None)
        op.session = str(session)
        calls[asyncio.create_task(_one_call(page, op, planned, ledger, lost))] = op
        await ctx.pause(PACE_SECONDS)
    await settle(calls, ledger)


async def _one_call(
    page: Page, op: Op, planned: plan.Planned, ledger: Ledger, lost: asyncio.Event
) -> None:
    if planned.cancel_after is not None:
        ledger.count(DOOR, "cancels")
        op.cancelled_at = op.sent_at + planned.cancel_after
        ledger.note(op, f"abort at +{planned.cancel_after} s ({op.cancel_plan})")
    arguments = {
        "capability": planned.capability, "params": plan.params_for(op.tag, planned),
        "callId": op.tag, "cancelAfter": planned.cancel_after,
    }  # fmt: skip
    try:
        response = await asyncio.wait_for(page.evaluate(CALL, arguments), 180)
    except (PlaywrightError, TimeoutError) as failed:
        op.told = f"the page failed: {type(failed).__name__}: {str(failed)[:120]}"
        ledger.note(op, op.told)
        lost.set()
        return
    if response.get("success") is True:
        ledger.answer(op, "succeeded", {}, data_ok=names_call(op.tag, response.get("data")))
        return
    error = response.get("error") or {}
    ledger.answer(op, outcome_of_error(error, bool(response.get("cancelled"))), {"error": error})
    if error.get("code") in ("DISCONNECTED", "SESSION_INVALID", "SESSION_EXPIRED"):
        lost.set()  # the session is gone: a new page
