"""Calls per minute per principal, counted in Redis (shared by every Daphne).

The `limits` library's moving window: at most N calls in any 60 s, and the exact
time until the oldest one leaves the window, which becomes `retryAfter`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from django.conf import settings
from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter as SyncMovingWindowRateLimiter

from capabilities import redis_pool

logger = logging.getLogger(__name__)

_limiters: dict[int, MovingWindowRateLimiter] = {}


def _limiter() -> MovingWindowRateLimiter:
    # redis.asyncio connections belong to the loop that made them: one per loop.
    loop_id = id(asyncio.get_running_loop())
    limiter = _limiters.get(loop_id)
    if limiter is None:
        url = settings.REDIS_URL.replace("redis://", "async+redis://", 1)
        storage = RedisStorage(
            url,
            implementation="redispy",
            key_prefix="abp:rate",
            # The consumers' bounded pool: a burst waits for a connection, never skips.
            # (limits' redis-py bridge takes a pool; its option type says otherwise.)
            connection_pool=redis_pool.pool(),  # type: ignore[arg-type]
        )
        limiter = _limiters[loop_id] = MovingWindowRateLimiter(storage)
    return limiter


async def retry_after_ms(identity: str, per_minute: int) -> int | None:
    """Count one call; None if it is within the budget, else how long to wait (ms).

    Redis trouble lets the call through: it would fail to queue anyway if Redis
    is gone, with its own error, and a limiter must not turn a blip into refusals.
    """
    item = RateLimitItemPerMinute(per_minute)
    try:
        limiter = _limiter()
        if await limiter.hit(item, identity):
            return None
        stats = await limiter.get_window_stats(item, identity)
    except Exception:
        logger.warning("Rate limiter unavailable; letting the call through", exc_info=True)
        return None
    return max(1, math.ceil((stats.reset_time - time.time()) * 1000))


async def warm() -> None:
    """Open the limiter's connection and load its window script (counts no call)."""
    await _limiter().get_window_stats(RateLimitItemPerMinute(1), "abp:warm-up")


_sync_limiter: list[SyncMovingWindowRateLimiter] = []


def take(identity: str, per_minute: int) -> bool:
    """Count one request from synchronous code (a Django view); False if over budget.

    As for calls, Redis trouble lets the request through.
    """
    try:
        if not _sync_limiter:
            storage = storage_from_string(settings.REDIS_URL, key_prefix="abp:rate")
            _sync_limiter.append(SyncMovingWindowRateLimiter(storage))
        return bool(_sync_limiter[0].hit(RateLimitItemPerMinute(per_minute), identity))
    except Exception:
        logger.warning("Rate limiter unavailable; letting the request through", exc_info=True)
        return True
