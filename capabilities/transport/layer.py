"""Channel-layer calls from consumers, retried once on a dead pooled Redis connection.

After a Redis restart the first call on each pooled connection fails; without the
retry (redis_pool.twice) that would raise in the consumer, and Daphne would close
the socket with 1011.
"""

from __future__ import annotations

from typing import Any

from capabilities.redis_pool import twice


class RetryingLayer:
    """The group calls a consumer makes, each tried twice."""

    def __init__(self, layer: Any) -> None:
        self._layer = layer

    async def group_add(self, group: str, channel: str) -> None:
        await twice(lambda: self._layer.group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await twice(lambda: self._layer.group_discard(group, channel))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await twice(lambda: self._layer.group_send(group, message))
