"""Live workers: what each one announces in Redis, and reading them back.

Each worker (its main process) writes a key with a TTL every few seconds
(`capabilities/worker/presence.py`): its hostname, the queues it consumes, its
concurrency and the jobs it runs. A worker that dies stops writing, and its key
expires within WORKER_TTL_SECONDS. A set indexes the keys, so reading every live
worker is two round trips, with no SCAN over the keyspace.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
from redis.commands.core import Script

from capabilities import redis_pool
from capabilities.conf import abp_settings


@dataclass(frozen=True, kw_only=True)
class LiveWorker:
    """One worker, as it last announced itself."""

    hostname: str
    queues: tuple[str, ...]
    concurrency: int
    jobs: tuple[str, ...]
    pid: int
    announced_at: float

    def to_json(self) -> dict[str, Any]:
        """What the worker writes."""
        return {
            "hostname": self.hostname,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "jobs": list(self.jobs),
            "pid": self.pid,
            "announcedAt": self.announced_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveWorker:
        """What a reader gets back."""
        return cls(
            hostname=str(data["hostname"]),
            queues=tuple(str(q) for q in data.get("queues", ())),
            concurrency=int(data.get("concurrency", 0)),
            jobs=tuple(str(j) for j in data.get("jobs", ())),
            pid=int(data.get("pid", 0)),
            announced_at=float(data.get("announcedAt", 0.0)),
        )

    @property
    def heartbeat_age(self) -> float:
        """Seconds since it last announced itself."""
        return max(0.0, time.time() - self.announced_at)


def _prefix() -> str:
    return abp_settings().WORKER_KEY_PREFIX


def _index() -> str:
    return f"{_prefix()}index"


def announce(worker: LiveWorker) -> bool:
    """Write (or refresh) a worker's key, with its TTL, in one round trip.

    True if this Redis held no announcement yet: it lost its data (a restart
    without persistence), or no worker ever ran on it.
    """
    pipe = redis_pool.sync_client().pipeline(transaction=False)
    pipe.set(
        f"{_prefix()}{worker.hostname}",
        json.dumps(worker.to_json()),
        px=int(abp_settings().WORKER_TTL_SECONDS * 1000),
    )
    pipe.sadd(_index(), worker.hostname)
    _mark_script()(keys=[_marker(), _settling()], args=[_ttl_ms()], client=pipe)
    first = pipe.execute()[-1]
    return bool(first)


# The marker has no TTL: its absence means this Redis lost its data and no worker
# has announced itself to it since. Whoever sets it also sets `settling`, which
# lasts one worker TTL: by then every live worker has announced itself again.
_MARK = """
if redis.call('SET', KEYS[1], '1', 'NX') then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
  return 1
end
return 0
"""


@cache
def _mark_script() -> Script:
    return redis_pool.sync_client().register_script(_MARK)


def _ttl_ms() -> int:
    return int(abp_settings().WORKER_TTL_SECONDS * 1000)


def withdraw(hostname: str) -> None:
    """A worker shutting down says so at once, rather than waiting out its TTL."""
    pipe = redis_pool.sync_client().pipeline(transaction=False)
    pipe.delete(f"{_prefix()}{hostname}")
    pipe.srem(_index(), hostname)
    pipe.execute()


_seen: tuple[float, list[LiveWorker]] | None = None
_registry_lost = False


def live_workers(client: redis.Redis | None = None) -> list[LiveWorker]:
    """Every worker whose key has not expired, by hostname (read now).

    `client`: another client than the process's pool (/readyz's, with short timeouts).
    """
    global _seen, _registry_lost  # noqa: PLW0603 - the process's last reading, replaced whole
    found, _registry_lost = _read(client or redis_pool.sync_client())
    _seen = (time.monotonic(), found)
    return found


def registry_lost() -> bool:
    """Whether the last reading found Redis lately emptied (restarted without its data).

    Then nobody knows which workers live until they have all announced themselves
    again (within WORKER_TTL_SECONDS of the first): absence of workers proves nothing.
    """
    return _registry_lost


def recent() -> list[LiveWorker]:
    """The live workers as last read, read again if older than AVAILABILITY_POLL_SECONDS."""
    seen = _seen
    if seen is None or time.monotonic() - seen[0] > abp_settings().AVAILABILITY_POLL_SECONDS:
        return live_workers()
    return seen[1]


def last_seen() -> list[LiveWorker] | None:
    """The last reading, however old, or None (no I/O: for an event loop)."""
    seen = _seen
    return None if seen is None else seen[1]


def _marker() -> str:
    return f"{_prefix()}announced"


def _settling() -> str:
    return f"{_prefix()}settling"


def _read(client: redis.Redis) -> tuple[list[LiveWorker], bool]:
    pipe = client.pipeline(transaction=False)
    pipe.smembers(_index())
    pipe.exists(_marker())
    pipe.exists(_settling())
    members, marked, settling = pipe.execute()
    lost = not marked or bool(settling)
    names = sorted(_text(name) for name in members)
    if not names:
        return [], lost
    values = client.mget([f"{_prefix()}{name}" for name in names])
    found: list[LiveWorker] = []
    gone: list[str] = []
    for name, value in zip(names, values, strict=True):
        if value is None:
            gone.append(name)
            continue
        found.append(LiveWorker.from_json(json.loads(value)))
    if gone:
        client.srem(_index(), *gone)
    return found, lost


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def capacity(workers: list[LiveWorker]) -> dict[str, int]:
    """Job slots per queue: the concurrency of every live worker consuming it."""
    slots: dict[str, int] = {}
    for worker in workers:
        for queue in worker.queues:
            slots[queue] = slots.get(queue, 0) + worker.concurrency
    return slots
