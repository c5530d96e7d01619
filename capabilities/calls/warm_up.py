"""Daphne warm before its first call: the local lane and every connection, made at start.

Otherwise the first call pays for starting the lane's pool, opening the ORM
thread's database connection and the Redis and broker connections, and loading
the rate limiter's scripts (docs/benchmarks.md, "First call after start"). So:
- `begin()`, when the ASGI application is built (before the event loop runs),
  starts the lane's pool in a thread of its own;
- `ensure_started()`, at the first ASGI event of any kind (a probe's `/readyz`
  included), warms the rest on the event loop and waits for every lane process to
  have loaded its runners.
`/readyz` says `warming` until it is done (`is_warm`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import sync_to_async
from celery import current_app
from channels.db import database_sync_to_async
from django.db import connection

from capabilities import redis_pool
from capabilities.access import rate_limits
from capabilities.calls import availability
from capabilities.lane import lane

logger = logging.getLogger(__name__)

_lane_started = threading.Event()
_task: asyncio.Task[None] | None = None
_warm = False


def begin() -> None:
    """Start the local lane's pool now, off any event loop (its processes load meanwhile)."""

    def start() -> None:
        try:
            lane.current().start()
        except Exception:
            logger.exception("The local lane did not start; calls go through Celery")
        finally:
            _lane_started.set()

    threading.Thread(target=start, name="abp-warm-up", daemon=True).start()


def on_first_event(application: Any) -> Any:
    """The ASGI application, warming the process up at its first event (lifespan aside)."""

    async def warming(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if _task is None and scope["type"] != "lifespan":
            ensure_started()
        return await application(scope, receive, send)

    return warming


def ensure_started() -> None:
    """Warm this process up once, in a task on the running loop (returns at once)."""
    global _task  # noqa: PLW0603 - one warm-up per process
    if _task is None:
        _task = asyncio.get_running_loop().create_task(_warm_up(), name="abp-warm-up")


def is_warm() -> bool:
    """Whether the warm-up finished (or failed and gave up: calls are served anyway)."""
    return _warm


async def _warm_up() -> None:
    global _warm  # noqa: PLW0603 - set once
    try:
        await asyncio.gather(
            database_sync_to_async(_open_database)(),
            sync_to_async(_availability, thread_sensitive=False)(),
            rate_limits.warm(),
            redis_pool.client().ping(),
            sync_to_async(_broker, thread_sensitive=False)(),
            sync_to_async(_lane, thread_sensitive=False)(),
        )
    except Exception:
        logger.exception("Warming up failed; the first calls may be slower")
    finally:
        _warm = True
    lane.start_soon()


def _open_database() -> None:
    # `connection` is per thread: looked up here, in the ORM's thread, not the loop's.
    connection.ensure_connection()


def _availability() -> None:
    if availability.cached() is None:
        availability.refresh()


def _broker() -> None:
    # Celery's producer pool: the connection a job's hand-over takes first.
    with current_app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=1)


def _lane() -> None:
    _lane_started.wait()
    if not lane.current().warm():
        logger.warning("The local lane's processes did not all start in time")
