"""What /readyz and /metrics read of the whole deployment, off the event loop, with timeouts.

Both read the cluster's truth (the database, Redis, the workers' announcements), never
a process's own counters, so any web process answers for all of them. Each runs in
threads of its own (`Probe`), not in the thread Channels and Django share for the
database (`database_sync_to_async`): a slow scrape or a hung database must not hold
up the consumers' settles and cancels. Redis is read with short socket timeouts, so a
hung Redis ends a probe rather than a thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.db import close_old_connections, connection

from capabilities.jobs import workers
from capabilities.jobs.workers import LiveWorker

T = TypeVar("T")

# Connect and read timeout of every Redis command a probe or a scrape sends.
REDIS_TIMEOUT_SECONDS = 1.0


class Probe:
    """Threads of their own for one kind of check, each with its database connection."""

    def __init__(self, name: str, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, function: Callable[[], T], seconds: float) -> T:
        """`function()` in one of the threads; TimeoutError after `seconds`.

        A thread still stuck (a database that does not answer) keeps its slot until
        it returns; later calls wait for a free one and time out meanwhile.
        """
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(
            loop.run_in_executor(self._executor, _with_connection, function), seconds
        )


def _with_connection(function: Callable[[], T]) -> T:
    # As Django does around each request: drop a connection past its age or broken
    # (CONN_HEALTH_CHECKS), so a database that came back is reconnected to.
    close_old_connections()
    try:
        return function()
    except Exception:
        connection.close()
        raise


def redis_servers() -> dict[str, str]:
    """The Redis servers a web process needs, by role, each URL once.

    `redis` (REDIS_URL: abort flags, rate limits, live workers), and, when they point
    elsewhere, `channelLayer` (its shards: `channelLayer2`, ...) and `broker`.
    """
    servers = {"redis": settings.REDIS_URL}
    layers: dict[str, Any] = settings.CHANNEL_LAYERS
    layer: list[Any] = layers.get("default", {}).get("CONFIG", {}).get("hosts", [])
    for shard, host in enumerate(layer, start=1):
        address = host.get("address") if isinstance(host, dict) else host
        if isinstance(address, str):
            servers["channelLayer" if shard == 1 else f"channelLayer{shard}"] = address
    broker = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    if broker.startswith(("redis://", "rediss://", "unix://")):
        servers["broker"] = broker
    distinct: dict[str, str] = {}
    for role, url in servers.items():
        if url not in distinct.values():
            distinct[role] = url
    return distinct


@functools.cache
def redis_client(url: str) -> redis.Redis:
    """A client with short timeouts (one pool per URL and process, shared by threads)."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
    )


def twice(command: Callable[[], T]) -> T:
    """A Redis command, once more if it met a pooled connection Redis closed (a restart)."""
    try:
        return command()
    except redis.ConnectionError:
        return command()


def live_workers() -> list[LiveWorker]:
    """Every worker whose announcement has not expired, read with this module's timeouts."""
    client = redis_client(settings.REDIS_URL)
    return twice(lambda: workers.live_workers(client))
