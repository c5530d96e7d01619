"""Running a runner (capabilities/work/runs.py): its data, or the coded error it came to.

Pure: the registry's test capabilities and a do-nothing context, no database.
"""

from __future__ import annotations

import pytest

from capabilities.jobs.lifecycle import Outcome
from capabilities.lane.child import NoJob
from capabilities.models import JobStatus
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import runs
from capabilities.work.context import JobAborted


def test_data_becomes_a_success() -> None:
    ran = runs.run("test.sleep", {"steps": 0, "echo": 1}, NoJob())
    assert ran.error is None
    assert ran.data == {"steps": 0, "echo": 1}
    outcome = Outcome.of_run(ran)
    assert (outcome.status, outcome.result) == (JobStatus.SUCCEEDED, ran.data)


def test_an_unknown_capability_is_answered_so() -> None:
    ran = runs.run("no.such", {}, NoJob())
    assert ran.error == runs.UNKNOWN_CAPABILITY
    assert not ran.crashed


def test_a_crash_keeps_its_traceback_off_the_wire() -> None:
    ran = runs.run("test.sleep", {"mode": "crash", "steps": 0}, NoJob())
    assert ran.error == runs.CRASHED
    assert ran.crashed
    outcome = Outcome.of_run(ran)
    assert outcome.status == JobStatus.FAILED
    assert "asked to crash" in outcome.traceback
    assert outcome.error is not None
    assert "asked to crash" not in str(outcome.error.to_json())


def test_a_memory_error_becomes_the_callers_error() -> None:
    def exhaust() -> dict[str, object]:
        raise MemoryError

    mine = WireError(code=ErrorCode.OPERATION_FAILED, message="mine")
    ran = runs.run(
        "test.sleep", {"steps": 0}, NoJob(), within=lambda work: exhaust(), out_of_memory=mine
    )
    assert (ran.error, ran.out_of_memory, ran.crashed) == (mine, True, False)


def test_an_abort_and_what_the_caller_lets_through_are_raised_on() -> None:
    class Limit(Exception):
        pass

    def abort() -> dict[str, object]:
        raise JobAborted

    def limit() -> dict[str, object]:
        raise Limit

    with pytest.raises(JobAborted):
        runs.run("test.sleep", {"steps": 0}, NoJob(), within=lambda work: abort())
    with pytest.raises(Limit):
        runs.run("test.sleep", {"steps": 0}, NoJob(), within=lambda work: limit(), passing=(Limit,))
    assert runs.run("test.sleep", {"steps": 0}, NoJob(), within=lambda work: limit()).crashed
