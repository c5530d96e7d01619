"""Polling helpers for state that other processes change."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import anyio

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


async def eventually_async(probe: Callable[[], T | None], interval: float = 0.02) -> T:
    """`eventually` from an event loop, within ten seconds; the probe runs in a thread."""
    with anyio.fail_after(10.0):
        while True:
            value = await anyio.to_thread.run_sync(probe)
            if value:
                return value
            await anyio.sleep(interval)
