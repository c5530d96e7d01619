"""A job's last writes outlast a database restart (capabilities/worker/last_writes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
from django.db import OperationalError

from capabilities.worker import last_writes


@pytest.fixture(autouse=True)
def no_connections_to_close() -> Iterator[None]:
    """The writes here are made up: there is no connection to replace between tries."""
    with mock.patch("django.db.close_old_connections"):
        yield


def test_a_write_is_tried_again_until_the_database_answers() -> None:
    tries: list[int] = []

    def write() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise OperationalError("connection refused")
        return "settled"

    with mock.patch("time.sleep") as slept:
        assert last_writes.written(write, "job j settled") == "settled"
    assert len(tries) == 3
    assert [call.args[0] for call in slept.call_args_list] == [0.25, 0.5]


def test_past_a_minute_the_error_is_raised_for_the_reaper_to_answer_the_job() -> None:
    clock = iter(range(0, 1000, 20))  # 20 s between looks at the clock

    def write() -> None:
        raise OperationalError("connection refused")

    with (
        mock.patch("time.sleep"),
        mock.patch("time.monotonic", side_effect=lambda: float(next(clock))),
        pytest.raises(OperationalError),
    ):
        last_writes.written(write, "job j stopped")


def test_other_errors_are_not_tried_again() -> None:
    def write() -> None:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        last_writes.written(write, "job j settled")
