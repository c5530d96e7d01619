"""Helpers for the browser tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from django.db import connections
from playwright.sync_api import Page

from tests.support.waiting import eventually

T = TypeVar("T")

# Debian's Chromium, never a browser Playwright downloads.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]

# Playwright's sync API keeps its event loop marked as running on the main thread,
# where Django refuses ORM calls (SynchronousOnlyOperation): queries run on this thread.
_ORM_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="browser-tests-orm")


def orm(query: Callable[[], T]) -> T:
    """Run ORM work on the tests' ORM thread and return its result."""
    return _ORM_THREAD.submit(query).result()


def orm_eventually(probe: Callable[[], T | None], timeout: float = 10.0) -> T:
    """`eventually`, with the probe on the ORM thread."""
    return eventually(lambda: orm(probe), timeout=timeout)


def close_orm_thread() -> None:
    """Close the ORM thread's connections (the thread stays, idle, for a next run)."""
    _ORM_THREAD.submit(connections.close_all).result()


def until(page: Page, probe: Callable[[], T | None], timeout: float = 10.0) -> T:
    """The first truthy value of `probe`, letting Playwright deliver events meanwhile.

    Functions exposed to the page (`expose_function`) run only while Playwright's
    loop runs, so the wait between probes is spent inside Playwright, not asleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout}s")
        page.wait_for_timeout(20)
