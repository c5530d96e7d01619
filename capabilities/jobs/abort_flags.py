"""Abort flags: the one place they are raised, and read.

A flag is a Redis key per job (`<prefix><job id>`, TTL longer than any job's life)
plus a publish on one channel, so running work hears of it at once (the listeners
of abort_listener.py, in the workers and the local lane).
"""

from __future__ import annotations

import redis.asyncio

from capabilities import redis_pool
from capabilities.conf import abp_settings


def abort_key(job_id: str) -> str:
    """The Redis key of a job's abort flag."""
    return f"{abp_settings().ABORT_KEY_PREFIX}{job_id}"


def channel() -> str:
    """The pub/sub channel that announces every raised flag."""
    return abp_settings().ABORT_CHANNEL


def raise_flag(job_id: str) -> None:
    """Raise a job's abort flag and tell running workers, in one round trip."""
    pipe = redis_pool.sync_client().pipeline(transaction=False)
    pipe.set(abort_key(job_id), b"1", ex=abp_settings().ABORT_TTL_SECONDS)
    pipe.publish(channel(), job_id)
    pipe.execute()


async def raise_flag_async(job_id: str) -> None:
    """`raise_flag` from an event loop, without a thread hop."""
    client = redis_pool.client()

    async def raise_it() -> None:
        pipe = client.pipeline(transaction=False)
        pipe.set(abort_key(job_id), b"1", ex=abp_settings().ABORT_TTL_SECONDS)
        pipe.publish(channel(), job_id)
        await pipe.execute()

    await redis_pool.twice(raise_it)


def is_raised(job_id: str) -> bool:
    """Whether a job's abort flag is up (one Redis round trip: not for checkpoints)."""
    return bool(redis_pool.sync_client().exists(abort_key(job_id)))


async def is_raised_async(job_id: str, client: redis.asyncio.Redis) -> bool:
    """`is_raised` from an event loop, on `client`."""
    return bool(await client.exists(abort_key(job_id)))
