"""kombu's Redis transport, whose closed channels fail as a lost connection does.

A Redis restart can leave a worker's channel half closed: its first close fails on
the dead socket (before it is marked closed), then the connection drops its
transport. Closing the channel again (Celery does, before reconnecting) restores its
unacknowledged messages, and kombu, reading the broker's address from the dropped
transport, raises AttributeError. Celery ignores only connection errors there, so
the worker would die ("Unrecoverable error"). Here that state is the connection
error it is: Celery goes on to reconnect, and the message, still in Redis' unacked
set, is restored as kombu restores any (docs/reliability.md).
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    """A Redis channel that needs its connection's broker details to reach Redis."""

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError("The broker connection of this channel is closed.")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]  # not in the stubs
        return params


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel`."""

    Channel = Channel
