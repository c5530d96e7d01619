"""Fixtures for the browser tests: Debian's Chromium driven by Playwright, a second origin.

The browser is /usr/bin/chromium (`make test` installs Debian's package when it is
missing), never one Playwright downloads. Pages that embed the app are served by a
small HTTP server on the port of the allowed origin that the test environment set
(ABP_EMBED_ALLOWED_ORIGINS, tests/support/environment.py); the same server reached as
`localhost` is a second origin, one that is not allowed.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from capabilities.conf import abp_settings
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, close_orm_thread
from tests.conftest import ARTIFACTS
from tests.support.stack import Stack

PAGES = Path(__file__).parent / "pages"
SCREENSHOTS = ARTIFACTS / "browser"


@pytest.fixture(scope="package", autouse=True)
def _orm_thread() -> Iterator[None]:
    yield
    close_orm_thread()


# Package scope, not session: while Playwright's sync API runs, the main thread has an
# event loop marked as running, and Django refuses the ORM there; the tests after this
# package need it back.
@pytest.fixture(scope="package")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for the browser tests."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `make test` installs Debian's chromium package."
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def context(chromium: Browser) -> Iterator[BrowserContext]:
    """A fresh profile per test; no page in it may open a dialog, a window or a download."""
    fresh = chromium.new_context(viewport={"width": 1200, "height": 900})
    native_ui: list[str] = []

    def on_page(page: Page) -> None:
        page.on("dialog", lambda dialog: native_ui.append(f"dialog: {dialog.type}"))
        page.on("download", lambda download: native_ui.append(f"download: {download.url}"))
        page.on("popup", lambda popup: native_ui.append(f"popup: {popup.url}"))

    fresh.on("page", on_page)
    try:
        yield fresh
    finally:
        fresh.close()
    assert native_ui == [], "ABP pages must not use native UI"


@pytest.fixture
def page(context: BrowserContext, stack: Stack) -> Page:
    """A tab; the stack is running."""
    return context.new_page()


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Keep a screenshot as a test artifact (var/test-artifacts/browser/<name>.png)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


@dataclass(frozen=True, kw_only=True)
class ParentSite:
    """Pages of another site, served on the allowed origin and on a disallowed one."""

    allowed: str
    disallowed: str

    def url(self, origin: str, page: str, **query: str) -> str:
        """The URL of one of tests/browser/pages/ on one of the two origins."""
        return f"{origin}/{page}?{urlencode(query)}" if query else f"{origin}/{page}"


class _QuietHandler(SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="package")
def parent_site() -> Iterator[ParentSite]:
    """A tiny HTTP server for the parent pages, on the allowed origin's port."""
    allowed = abp_settings().EMBED_ALLOWED_ORIGINS[0]
    port = urlsplit(allowed).port
    assert port is not None
    server = ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(_QuietHandler, directory=str(PAGES))
    )
    thread = threading.Thread(target=server.serve_forever, name="parent-site", daemon=True)
    thread.start()
    try:
        yield ParentSite(allowed=allowed, disallowed=f"http://localhost:{port}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


CONNECT = """async (app) => {
  const frame = document.getElementById("bridge");
  const client = await window.abpClient.connect({ window: frame.contentWindow, origin: app });
  window.client = client;
  window.traffic = [];
  client.onEnvelope((direction, message) => window.traffic.push([direction, message.type]));
  const session = await client.initialize({ agent: { name: "parent page", version: "1" } });
  return session.sessionId;
}"""

START_SLEEPER = """(callId) => {
  window.controller = new AbortController();
  window.progress = [];
  window.result = window.client.call("test.sleep", { steps: 500, stepMs: 20 }, {
    callId,
    signal: window.controller.signal,
    onProgress: (progress) => window.progress.push(progress),
  });
}"""


def open_parent(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("() => window.parentReady === true")


@pytest.fixture
def parent(page: Page, parent_site: ParentSite, stack: Stack) -> uuid.UUID:
    """A page on the allowed second origin, connected through the bridge; its session id."""
    open_parent(page, parent_site.url(parent_site.allowed, "parent.html", app=stack.http_url))
    return uuid.UUID(page.evaluate(CONNECT, stack.http_url))
