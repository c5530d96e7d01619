"""Which capabilities can run now: those whose queue a live worker consumes.

Each process keeps a snapshot of the live workers' queues, at most
AVAILABILITY_POLL_SECONDS old: a call to a capability with no live worker is
refused at once (CAPABILITY_UNAVAILABLE, retryable) instead of waiting out its
timeout. Calls already queued keep waiting for their deadline, or for a worker.

When availability changes, connected sessions are told once, whichever Daphne
noticed first: the last state sent lives in Redis, swapped atomically
(`SET ... GET`), and only the process that swapped in a new state sends it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from capabilities import redis_pool
from capabilities.conf import abp_settings
from capabilities.jobs import notes, outages, queue, workers
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import registry

AVAILABILITY_GROUP = "abp.availability"


@dataclass(frozen=True)
class Snapshot:
    """The queues live workers consume."""

    queues: frozenset[str]

    @classmethod
    def of(cls, live: list[workers.LiveWorker]) -> Snapshot:
        """From the workers as read."""
        return cls(frozenset(name for name, n in workers.capacity(live).items() if n > 0))

    @classmethod
    def everything(cls) -> Snapshot:
        """Every capability's queue: what nobody can say is unavailable."""
        return cls(frozenset(queue.queue_for(spec.name) for spec in registry.all_specs()))

    def states(self) -> dict[str, bool]:
        """Every capability, and whether a live worker can run it."""
        return {
            spec.name: queue.queue_for(spec.name) in self.queues for spec in registry.all_specs()
        }


def refresh() -> Snapshot:
    """Read the live workers now."""
    return Snapshot.of(workers.live_workers())


def cached() -> Snapshot | None:
    """As last read, however old (no I/O: for an event loop)."""
    seen = workers.last_seen()
    return None if seen is None else Snapshot.of(seen)


def current() -> Snapshot:
    """As read at most AVAILABILITY_POLL_SECONDS ago (reads Redis if older)."""
    return Snapshot.of(workers.recent())


def for_listing() -> Snapshot:
    """As `current`; while Redis cannot be read, the last reading, or everything.

    A listing (the manifest, MCP's tools/list) is advice: the call checks again. Failing
    it would fail every replica's listings at once for as long as Redis restarts.
    """
    try:
        return current()
    except outages.REDIS_AWAY:
        return cached() or Snapshot.everything()


def unavailable(capability: str) -> WireError | None:
    """CAPABILITY_UNAVAILABLE if no live worker consumes the capability's queue."""
    name = queue.queue_for(capability)
    # A refusal reads Redis afresh: a worker that just came up is never missed, and
    # a Redis that just lost its data refuses nothing (the call waits for a worker).
    if name in current().queues or name in refresh().queues or workers.registry_lost():
        return None
    wait_ms = abp_settings().UNAVAILABLE_RETRY_AFTER_MS
    return WireError(
        code=ErrorCode.CAPABILITY_UNAVAILABLE,
        message=f"No worker is running {capability} now (queue {name}); retry after {wait_ms} ms.",
        retryable=True,
        retry_after_ms=wait_ms,
        details={"capability": capability, "queue": name},
    )


def announce_if_changed(snapshot: Snapshot) -> bool:
    """Tell every connected session if availability changed since it was last told."""
    states = snapshot.states()
    value = json.dumps(states, sort_keys=True)
    key = f"{abp_settings().WORKER_KEY_PREFIX}availability"
    previous = redis_pool.sync_client().set(key, value, get=True)
    if not isinstance(previous, bytes) or previous.decode() == value:
        # Nothing was announced before: sessions got this state when they opened.
        return False
    notes.notify_group(AVAILABILITY_GROUP, notes.capabilities_changed(states))
    return True
