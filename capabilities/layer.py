"""Channel-layer calls from consumers, retried once on a dead pooled Redis connection.

After Redis restarts, the first command on each pooled connection fails ("Connection
closed by server") and the client then reconnects; the notifier (sync code) and the
abort flags already try twice for that reason. Without it a consumer's first group
call after a restart raised, and Daphne closed that socket with 1011.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis


async def _twice(call: Callable[[], Awaitable[None]]) -> None:
    for attempt in range(2):
        try:
            await call()
        except redis.ConnectionError:
            if attempt:
                raise
        else:
            return


class RetryingLayer:
    """The group calls a consumer makes, each tried twice."""

    def __init__(self, layer: Any) -> None:
        self._layer = layer

    async def group_add(self, group: str, channel: str) -> None:
        await _twice(lambda: self._layer.group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await _twice(lambda: self._layer.group_discard(group, channel))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await _twice(lambda: self._layer.group_send(group, message))
