"""Each Daphne watches the live workers, so its sessions hear when availability changes.

One task per process, started by the first connection: every
AVAILABILITY_POLL_SECONDS it reads the live workers (keeping the process's
snapshot fresh for calls and initialize results, which then read no Redis), and
announces a change to every session (capabilities/calls/availability.py sends it
once, whichever Daphne saw it first).
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async

from capabilities.calls import availability
from capabilities.conf import abp_settings

logger = logging.getLogger(__name__)

_task: asyncio.Task[None] | None = None


async def ensure_started() -> None:
    """Have a fresh snapshot, and the watch running on this event loop."""
    global _task  # noqa: PLW0603 - one watch per process
    if availability.cached() is None:
        await sync_to_async(availability.refresh, thread_sensitive=False)()
    if _task is None or _task.done():
        _task = asyncio.get_running_loop().create_task(_watch(), name="abp-availability")


def states() -> dict[str, bool]:
    """What the last snapshot says of every capability (no I/O)."""
    snapshot = availability.cached()
    return snapshot.states() if snapshot is not None else {}


def _poll() -> None:
    availability.announce_if_changed(availability.refresh())


async def _watch() -> None:
    interval = abp_settings().AVAILABILITY_POLL_SECONDS
    while True:
        await asyncio.sleep(interval)
        try:
            await sync_to_async(_poll, thread_sensitive=False)()
        except Exception:
            logger.warning("Could not read the live workers", exc_info=True)
