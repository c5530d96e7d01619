"""A web process that is stopping: it takes no new session, and says so.

Set once, when Daphne begins its shutdown (SIGTERM; `capabilities/asgi.py` closes
every open WebSocket with 1012 then). Read by `/readyz`, which answers 503 so a load
balancer sends new sessions elsewhere, and by the consumers, which close a socket
opened meanwhile with 1012 too: every client resumes its session on another instance
(docs/operating.md#rolling-restarts).
"""

from __future__ import annotations

import threading

_draining = threading.Event()


def begin() -> None:
    """This process is stopping (for good: nothing ends a drain)."""
    _draining.set()


def is_draining() -> bool:
    """Whether this process is stopping."""
    return _draining.is_set()
