"""Redis connections: one bounded, waiting pool per event loop, one client per process.

Abort flags and the rate limiter talk to Redis from Daphne's event loop. redis-py's
default asyncio pool refuses a command outright once 100 connections are busy
(MaxConnectionsError), so a burst of calls could skip the limiter or lose an abort
flag. A BlockingConnectionPool makes a command wait for a free connection instead,
up to a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import cache
from typing import TypeVar

import redis
import redis.asyncio
from django.conf import settings

T = TypeVar("T")

# Connections one Daphne process keeps to Redis for flags and limits; commands take
# well under a millisecond, so a burst queues briefly instead of opening hundreds.
MAX_CONNECTIONS = 32
WAIT_SECONDS = 5.0

_pools: dict[int, redis.asyncio.BlockingConnectionPool] = {}


def pool() -> redis.asyncio.BlockingConnectionPool:
    """This event loop's pool (asyncio connections belong to the loop that made them)."""
    loop_id = id(asyncio.get_running_loop())
    found = _pools.get(loop_id)
    if found is None:
        found = _pools[loop_id] = redis.asyncio.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=MAX_CONNECTIONS, timeout=WAIT_SECONDS
        )
    return found


def client() -> redis.asyncio.Redis:
    """A client on this loop's pool."""
    return redis.asyncio.Redis(connection_pool=pool())


async def twice(command: Callable[[], Awaitable[T]]) -> T:
    """Run a Redis command, once more if it met a dead pooled connection.

    After Redis restarts, the first command on each pooled connection fails
    ("Connection closed by server") and the client then reconnects.
    """
    try:
        return await command()
    except redis.ConnectionError:
        return await command()


@cache
def sync_client() -> redis.Redis:
    """The process's blocking client (redis-py's pool notices a fork and reconnects)."""
    return redis.Redis.from_url(settings.REDIS_URL)
