"""The live-worker registry across a Redis that lost its data, on the stack's Redis.

Each test writes under a prefix of its own, which starts out as an emptied Redis does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities.calls import availability
from capabilities.jobs import workers
from tests.support.stack import Stack
from tests.support.waiting import eventually

TTL = 2.0  # long enough that a loaded machine still checks within it


@pytest.fixture
def emptied(stack: Stack) -> Iterator[None]:
    """A registry no worker has announced itself to yet, with a short worker TTL."""
    prefix = f"abp:test-registry:{uuid.uuid4().hex}:"
    queues = {"process.image": "abp.test-registry"}
    abp = {**settings.ABP, "WORKER_KEY_PREFIX": prefix, "WORKER_TTL_SECONDS": TTL}
    with override_settings(ABP={**abp, "CAPABILITY_QUEUES": queues}):
        yield
        for worker in workers.live_workers():
            workers.withdraw(worker.hostname)


def worker_on(queue: str) -> workers.LiveWorker:
    return workers.LiveWorker(
        hostname=f"w-{uuid.uuid4().hex[:8]}@test",
        queues=(queue,),
        concurrency=1,
        jobs=(),
        pid=4242,
        announced_at=time.time(),
    )


@pytest.mark.usefixtures("emptied")
def test_only_the_first_announcement_to_an_emptied_redis_says_so() -> None:
    assert workers.announce(worker_on("abp.small")) is True
    assert workers.announce(worker_on("abp.small")) is False
    assert workers.announce(worker_on("abp.heavy")) is False


@pytest.mark.usefixtures("emptied")
def test_nothing_is_refused_until_every_worker_had_time_to_announce_itself() -> None:
    # Nobody announced yet: absence proves nothing.
    assert availability.unavailable("process.image") is None
    # One worker is back, on another queue; process.image's may be a moment behind.
    workers.announce(worker_on("abp.small"))
    assert availability.unavailable("process.image") is None
    # Past one worker TTL every live worker has announced itself: absence is real.
    error = eventually(lambda: availability.unavailable("process.image"), timeout=15)
    assert error.code == "CAPABILITY_UNAVAILABLE"
    workers.announce(worker_on("abp.test-registry"))
    assert availability.unavailable("process.image") is None
