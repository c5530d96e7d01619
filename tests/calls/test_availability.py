"""Listings while Redis cannot be read (calls/availability.py `for_listing`), in-process:
the registry's reads raise as a restarting Redis makes them."""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
import redis

from capabilities.calls import availability
from capabilities.jobs import queue, workers

HEAVY_ONLY = workers.LiveWorker(
    hostname="heavy@a", queues=("abp.heavy",), concurrency=2, jobs=(), pid=1, announced_at=0.0
)


def _redis_away() -> list[workers.LiveWorker]:
    raise redis.ConnectionError("Connection closed by server.")


@pytest.fixture(autouse=True)
def redis_restarting() -> Iterator[None]:
    with mock.patch.object(workers, "recent", _redis_away):
        yield


def test_a_listing_while_redis_restarts_gives_the_last_reading() -> None:
    with mock.patch.object(workers, "last_seen", return_value=[HEAVY_ONLY]):
        states = availability.for_listing().states()
    assert states["export.pdf"] is True
    assert states["convert.markdownToHtml"] is False
    assert states == {name: queue.queue_for(name) == "abp.heavy" for name in states}


def test_a_listing_before_any_reading_refuses_nothing() -> None:
    with mock.patch.object(workers, "last_seen", return_value=None):
        assert all(availability.for_listing().states().values())


def test_a_call_is_still_checked_against_redis() -> None:
    # Only listings are advice; a call's own check raises, and the call is refused as
    # one that could not be queued (calls/start.py).
    with pytest.raises(redis.ConnectionError):
        availability.unavailable("export.pdf")
