"""The one outage policy (capabilities/jobs/outages.py)."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
import redis
from django.db import IntegrityError, OperationalError

from capabilities.jobs import outages


def test_pauses_grow_then_the_longest_repeats() -> None:
    assert list(itertools.islice(outages.pauses(), 7)) == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_an_outage_is_a_service_away_and_a_bug_is_not() -> None:
    assert isinstance(OperationalError("server closed the connection"), outages.DATABASE_AWAY)
    assert not isinstance(IntegrityError("duplicate key"), outages.DATABASE_AWAY)
    assert isinstance(redis.ConnectionError("Error 111 connecting"), outages.REDIS_AWAY)
    assert isinstance(ConnectionRefusedError(), outages.REDIS_AWAY)
    assert not isinstance(ValueError(), outages.REDIS_AWAY)


def test_a_step_is_tried_again_while_redis_is_away() -> None:
    tries: list[int] = []

    def step() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379")
        return "sent"

    with mock.patch.object(outages, "PAUSES", (0.001,)):
        assert outages.retried(step, "the notice", away=outages.REDIS_AWAY, for_seconds=5) == "sent"
    assert len(tries) == 3


def test_past_its_deadline_the_outage_is_raised_to_the_caller() -> None:
    def step() -> None:
        raise redis.ConnectionError("Error 111")

    with (
        mock.patch.object(outages, "PAUSES", (0.02,)),
        pytest.raises(redis.ConnectionError),
    ):
        outages.retried(step, "x", away=outages.REDIS_AWAY, for_seconds=0.05)


def test_a_bug_is_never_tried_again() -> None:
    tries: list[int] = []

    def step() -> None:
        tries.append(1)
        raise IntegrityError("duplicate key")

    with pytest.raises(IntegrityError):
        outages.retried(step, "x", away=outages.DATABASE_AWAY, for_seconds=60)
    assert tries == [1]
