"""The channel layer every process uses: channels_redis' pub/sub layer, retrying.

After a Redis restart the first call on each pooled connection fails ("Connection
closed by server") and the client then reconnects. Each call is tried once more
(redis_pool.twice): otherwise a new socket's `new_channel`, made by Channels before
any of our code runs, would fail its handshake with HTTP 500, and a consumer's group
call would close the socket with 1011.
"""

from __future__ import annotations

from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer

from capabilities.redis_pool import twice


class RetryingPubSubChannelLayer(RedisPubSubChannelLayer):  # type: ignore[misc]
    """RedisPubSubChannelLayer whose calls survive one dead pooled connection."""

    def _call(self, name: str) -> Any:
        # The parent hands every call to this event loop's own layer.
        return super().__getattr__(name)

    async def new_channel(self, prefix: str = "specific.") -> str:
        result: str = await twice(lambda: self._call("new_channel")(prefix))
        return result

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await twice(lambda: self._call("send")(channel, message))

    async def group_add(self, group: str, channel: str) -> None:
        await twice(lambda: self._call("group_add")(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await twice(lambda: self._call("group_discard")(group, channel))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await twice(lambda: self._call("group_send")(group, message))
