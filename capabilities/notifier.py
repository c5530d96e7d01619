"""Send channel-layer messages to consumers' groups from sync code (workers, admin, reaper).

`async_to_sync(layer.group_send)` would start a new event loop, and with it a new
Redis connection, for every message. Instead each thread keeps one event loop of
its own and runs each send on it: connections stay warm, messages leave in the
order they were sent, and `notify` returns once the message is out.
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

_local = threading.local()


def _loop() -> asyncio.AbstractEventLoop:
    # Keyed by process too: a forked child must not share its parent's connections.
    pid, loop = getattr(_local, "pid_loop", (None, None))
    if pid != os.getpid() or loop is None:
        loop = asyncio.new_event_loop()
        _local.pid_loop = (os.getpid(), loop)
    return loop


def notify(session_id: str, message: dict[str, Any]) -> bool:
    """Send a message to a session's consumer; False if it could not be sent.

    A lost message loses nothing: outcomes live in the DB, and consumers read them.
    """
    return notify_group(session_group(session_id), message)


def notify_group(group: str, message: dict[str, Any]) -> bool:
    """Send a message to every consumer in a channel-layer group; False if it failed."""
    layer = get_channel_layer()
    # Twice: after a Redis restart the first send meets a dead pooled connection,
    # which the client then drops, so a second try goes out on a new one.
    for attempt in range(2):
        try:
            _loop().run_until_complete(layer.group_send(group, message))
        except Exception:
            if attempt:
                logger.warning("Could not send %s to %s", message.get("type"), group, exc_info=True)
        else:
            return True
    return False
