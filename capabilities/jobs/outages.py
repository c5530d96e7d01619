"""One outage policy: which errors mean PostgreSQL or Redis is away, and how to try again.

Every place where the database, Redis or the channel layer can fail uses it:
- `DATABASE_AWAY`, `REDIS_AWAY`: the errors of a service restarting, failing over
  or out of reach. Anything else is a bug, and is raised as one.
- `pauses()`: the waits between tries, growing to `PAUSES[-1]`, which then repeats.
- `retried`: a step tried again while its service is away, until its deadline (an
  async step loops over `pauses()` itself); past it the error is raised, and the
  caller answers as its door says (a retryable refusal: `NOT_QUEUED`, close code
  1013, or HTTP 503), so no call is lost and none is answered twice. Every step
  retried is idempotent: a conditional update, or an insert that finds its row on the
  next try.
docs/design.md, "Failures: timeouts, dead workers, Redis restarts", lists each place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import redis
from django import db

logger = logging.getLogger(__name__)

T = TypeVar("T")

DATABASE_AWAY: tuple[type[Exception], ...] = (db.OperationalError, db.InterfaceError)
# redis-py's errors, or the socket's own; the channel layer raises the same.
REDIS_AWAY: tuple[type[Exception], ...] = (redis.RedisError, OSError)

# Seconds between tries; the last repeats. A restart takes seconds, a failover tens.
PAUSES = (0.25, 0.5, 1.0, 2.0)


def pauses() -> Iterator[float]:
    """The waits between one step's tries: growing, then the longest, forever."""
    yield from PAUSES
    while True:
        yield PAUSES[-1]


def retried(
    step: Callable[[], T], what: str, *, away: tuple[type[Exception], ...], for_seconds: float
) -> T:
    """`step()`, tried again while its service is `away`, for up to `for_seconds`."""
    give_up_at = time.monotonic() + for_seconds
    for pause in pauses():
        try:
            return step()
        except away as error:
            if time.monotonic() + pause > give_up_at:
                raise
            _log_retry(what, error, pause)
            if isinstance(error, DATABASE_AWAY):
                db.close_old_connections()  # the broken one, so the next try opens another
            time.sleep(pause)
    raise AssertionError("pauses() never ends")


def _log_retry(what: str, error: Exception, pause: float) -> None:
    reason = str(error).strip()[:200] or type(error).__name__
    logger.warning("%s: its service is away (%s); trying again in %g s", what, reason, pause)
