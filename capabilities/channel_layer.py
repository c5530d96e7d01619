"""The channel layer every process uses: channels_redis' pub/sub layer, retrying.

It can also delete a channel: channels_redis forgets a channel made by `new_channel`
(its queue, its Redis subscription) only when a `receive` on it is cancelled, as
Channels' consumers' are when they end (django/channels_redis#276). A channel whose
last receive returned (an MCP call's watch) would otherwise be kept for good.

After a Redis restart the first call on each pooled connection fails ("Connection
closed by server") and the client then reconnects. Each call is tried once more
(redis_pool.twice): otherwise a new socket's `new_channel`, made by Channels before
any of our code runs, would fail its handshake with HTTP 500, and a consumer's group
call would close the socket with 1011.
"""

from __future__ import annotations

import logging
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer

from capabilities.redis_pool import twice

logger = logging.getLogger(__name__)


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

    async def delete_channel(self, channel: str) -> None:
        """Forget a channel made by `new_channel`: its queue, and its Redis subscription."""
        layer = self._get_layer()
        if layer.channels.pop(channel, None) is None:
            return
        shard = layer._get_shard(channel)
        try:
            await twice(lambda: shard.unsubscribe(channel))
        except Exception:  # Redis away: the subscription went with its connection
            logger.warning("Could not unsubscribe %s", channel, exc_info=True)
