"""Notes to the consumers holding sessions, over the channel layer: one builder each.

Every note a worker, the reaper, the admin or a consumer sends is built here, so
its fields are named once; each `type` is the handler a consumer runs for it.

`async_to_sync(layer.group_send)` would start a new event loop, and with it a new
Redis connection, for every note. Instead each thread keeps one event loop of its
own and sends on it: connections stay warm, notes leave in the order they were
sent, and `notify` returns once the note is out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

from capabilities.models import session_group

logger = logging.getLogger(__name__)

Note = dict[str, Any]

_local = threading.local()


def job_started(call_id: str) -> Note:
    """The worker started the call's job."""
    return {"type": "job.started", "call_id": call_id}


def job_progress(
    call_id: str,
    *,
    progress: float,
    total: float | None,
    stage: str,
    position: int | None = None,
) -> Note:
    """The call's job made progress; a queued one, its place in line."""
    return {
        "type": "job.progress",
        "call_id": call_id,
        "progress": progress,
        "total": total,
        "stage": stage,
        "position": position,
    }


def job_settled(call_id: str, response: dict[str, Any] | None = None) -> Note:
    """The call's job settled; `response`, when small, saves the consumer a DB read."""
    note: Note = {"type": "job.settled", "call_id": call_id}
    if response is not None:
        note["response"] = response
    return note


def job_returned(job_id: str) -> Note:
    """A settled result nobody sent: the session's holder should take and send it."""
    return {"type": "job.returned", "job_id": job_id}


def capabilities_changed(available: dict[str, bool]) -> Note:
    """Which capabilities a live worker can run changed (to AVAILABILITY_GROUP)."""
    return {"type": "capabilities.changed", "available": available}


def session_superseded(generation: int) -> Note:
    """Another connection resumed the session (its newer generation)."""
    return {"type": "session.superseded", "generation": generation}


def agent_key_revoked(reason: str = "key-revoked") -> Note:
    """Access was withdrawn from the connection: its key revoked, or its user deactivated.

    `reason`: the stable close reason it is refused with (protocol/closes.py).
    """
    return {"type": "agent.key_revoked", "reason": reason}


def _loop() -> asyncio.AbstractEventLoop:
    # Keyed by process too: a forked child must not share its parent's connections.
    pid, loop = getattr(_local, "pid_loop", (None, None))
    if pid != os.getpid() or loop is None:
        loop = asyncio.new_event_loop()
        _local.pid_loop = (os.getpid(), loop)
    return loop


def close_thread_loop() -> None:
    """Close this thread's loop, and with it the channel layer's connections on it.

    For a thread that ends (one that sent notes off a running loop): each loop keeps a
    layer of its own in channels_redis, with its Redis connections, until it is closed.
    """
    pid, loop = getattr(_local, "pid_loop", (None, None))
    _local.pid_loop = (None, None)
    if loop is not None and pid == os.getpid() and not loop.is_closed():
        loop.close()


def notify(session_id: str, note: Note) -> bool:
    """Send a note to a session's consumer; False if it could not be sent.

    A lost note loses nothing: outcomes live in the DB, and consumers read them.
    """
    return notify_group(session_group(session_id), note)


def notify_group(group: str, note: Note) -> bool:
    """Send a note to every consumer in a channel-layer group; False if it failed."""
    layer = get_channel_layer()
    try:
        _loop().run_until_complete(layer.group_send(group, note))
    except Exception:
        logger.warning("Could not send %s to %s", note.get("type"), group, exc_info=True)
        return False
    return True
