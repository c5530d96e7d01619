"""Polling helpers for state that other processes change."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import anyio
from django.db import connections

T = TypeVar("T")


def seconds_between(earlier: datetime | None, later: datetime | None) -> float:
    """Seconds from one recorded time to another; both must be set."""
    assert earlier is not None
    assert later is not None
    return (later - earlier).total_seconds()


def eventually(probe: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02) -> T:
    """The first truthy value `probe` returns within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout}s")
        time.sleep(interval)


async def in_thread(function: Callable[[], T]) -> T:
    """`function()` in one of anyio's worker threads, which then closes its DB connections.

    A connection left open in such a thread is only closed when the thread ends and it is
    garbage collected: psycopg warns then (ResourceWarning, an error in this suite), and
    PostgreSQL keeps a backend for it until then.
    """

    def closing() -> T:
        try:
            return function()
        finally:
            connections.close_all()

    return await anyio.to_thread.run_sync(closing)


async def eventually_async(probe: Callable[[], T | None], interval: float = 0.02) -> T:
    """`eventually` from an event loop, within ten seconds; the probe runs in a thread."""
    with anyio.fail_after(10.0):
        while True:
            value = await in_thread(probe)
            if value:
                return value
            await anyio.sleep(interval)
