"""The Interrupter: JobAborted raised into a job's thread, only where it is safe.

Pure: no database, no Redis. The watcher's part (raise on abort, then `poke` every
RERAISE_INTERVAL_SECONDS while the job is still inside its work) is played by the
test's own thread; the work runs in a thread of its own, as a task does in a worker
child, and spins in pure Python so that nothing but a raise from outside stops it.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from capabilities.work.context import JobAborted
from capabilities.worker.interrupter import RERAISE_INTERVAL_SECONDS, Interrupter
from tests.support.waiting import eventually

JOB = "job-1"
# Generous: the checks below wait for events, never for a duration to pass.
TIMEOUT = 10.0


class Job(threading.Thread):
    """A job's thread: begin, `run(work)`, end, as the executor does; keeps the outcome.

    The work's loops spin on plain attributes, never on threading primitives: a
    thread inside threading.py is somewhere the interrupter does not raise.
    """

    def __init__(
        self, interrupter: Interrupter, work: Callable[[Job], None], job_id: str = JOB
    ) -> None:
        super().__init__(name="abp-test-job", daemon=True)
        self.interrupter = interrupter
        self.job_id = job_id
        self.work = work
        self.outcome: BaseException | None = None
        self.finished_work = False
        self.stage = ""
        # Set by the test to let the work go on; `stopping` ends a test's loops if it fails.
        self.go_on = False
        self.stopping = False

    def run(self) -> None:
        self.interrupter.begin(self.job_id)
        try:
            self.interrupter.run(lambda: self.work(self))
            self.finished_work = True
        except BaseException as raised:
            self.outcome = raised
        finally:
            self.interrupter.end()

    def spin(self, stage: str) -> None:
        """Spin in pure Python until told to go on (or to stop)."""
        self.stage = stage
        while not (self.go_on or self.stopping):
            pass

    def reach(self, stage: str) -> None:
        """Wait until the work has reached `stage`."""
        eventually(lambda: self.stage == stage, timeout=TIMEOUT, interval=0.001)

    def finish(self) -> None:
        """Wait for the thread to end."""
        self.join(TIMEOUT)
        assert not self.is_alive(), f"the job is still running at {self.stage!r}"


Start = Callable[[Callable[[Job], None]], Job]


@pytest.fixture
def interrupter() -> Interrupter:
    """A fresh interrupter (not the worker process's one)."""
    return Interrupter()


@pytest.fixture
def start(interrupter: Interrupter) -> Iterator[Start]:
    """Start a job running `work`; stops its loops afterwards if a test failed."""
    started: list[Job] = []

    def start_job(work: Callable[[Job], None]) -> Job:
        job = Job(interrupter, work)
        started.append(job)
        job.start()
        return job

    yield start_job
    for job in started:
        job.stopping = True
        job.join(TIMEOUT)


def poke_until_done(interrupter: Interrupter, job: Job) -> None:
    """What the watcher does while a job is aborted: raise again until the work ends."""
    deadline = time.monotonic() + TIMEOUT
    while job.is_alive() and time.monotonic() < deadline:
        interrupter.poke()
        job.join(RERAISE_INTERVAL_SECONDS)
    job.finish()


def test_abort_raises_into_a_thread_busy_in_pure_python(
    interrupter: Interrupter, start: Start
) -> None:
    job = start(lambda job: job.spin("busy"))
    job.reach("busy")

    assert interrupter.abort(JOB) is True
    job.finish()

    assert isinstance(job.outcome, JobAborted)
    assert not job.finished_work


def test_a_swallowed_raise_is_raised_again_until_it_lands(
    interrupter: Interrupter, start: Start
) -> None:
    swallowed: list[BaseException] = []

    def work(job: Job) -> None:
        while True:
            try:
                job.spin("busy")
            except BaseException as raised:
                if swallowed:
                    raise
                swallowed.append(raised)

    job = start(work)
    job.reach("busy")
    assert interrupter.abort(JOB) is True
    eventually(lambda: swallowed, timeout=TIMEOUT, interval=0.001)
    assert job.is_alive()

    poke_until_done(interrupter, job)

    assert len(swallowed) == 1
    assert isinstance(swallowed[0], JobAborted)
    assert isinstance(job.outcome, JobAborted)


def test_no_raise_lands_inside_logging_it_lands_after(
    interrupter: Interrupter, start: Start
) -> None:
    # A raise between Handler.acquire() and its try would leave the handler's lock
    # held for good; the job waits on that lock here, so it sits inside logging.
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    logger = logging.getLogger("tests.interrupter")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)

    def work(job: Job) -> None:
        job.stage = "logging"
        logger.info("inside logging")
        job.spin("logged")

    handler.acquire()
    try:
        job = start(work)
        job.reach("logging")
        eventually(lambda: inside_logging(job), timeout=TIMEOUT, interval=0.001)
        assert interrupter.abort(JOB) is True
        for _ in range(20):
            interrupter.poke()
        assert inside_logging(job)
    finally:
        handler.release()
        logger.removeHandler(handler)

    poke_until_done(interrupter, job)

    assert isinstance(job.outcome, JobAborted)
    assert job.stage == "logged"
    assert written.getvalue() == "inside logging\n"
    # The lock is free: nothing was raised while the job held it.
    assert handler.lock is not None
    assert handler.lock.acquire(blocking=False)
    handler.lock.release()


def inside_logging(job: Job) -> bool:
    """Whether the job's thread is running code of the logging package right now."""
    assert job.ident is not None
    frame = sys._current_frames().get(job.ident)
    return frame is not None and f"{os.sep}logging{os.sep}" in frame.f_code.co_filename


def test_a_shielded_section_is_never_interrupted_and_ends_in_the_abort(
    interrupter: Interrupter, start: Start
) -> None:
    completed: list[str] = []

    def work(job: Job) -> None:
        with interrupter.shielded():
            job.spin("shielded")
            completed.append("shielded")
        job.stage = "after"

    job = start(work)
    job.reach("shielded")
    assert interrupter.abort(JOB) is True
    for _ in range(20):
        interrupter.poke()
        job.join(RERAISE_INTERVAL_SECONDS)
    assert job.is_alive()
    assert job.stage == "shielded"

    job.go_on = True
    job.finish()

    # Leaving the section is a checkpoint: the abort is honoured there.
    assert completed == ["shielded"]
    assert isinstance(job.outcome, JobAborted)
    assert job.stage == "shielded"


def test_work_of_a_job_aborted_before_it_runs_never_starts(interrupter: Interrupter) -> None:
    started: list[str] = []
    interrupter.begin(JOB)
    try:
        assert interrupter.abort(JOB) is True
        with pytest.raises(JobAborted):
            interrupter.run(lambda: started.append("work"))
    finally:
        interrupter.end()
    assert started == []


def test_after_end_an_abort_of_the_job_does_nothing(interrupter: Interrupter) -> None:
    interrupter.begin(JOB)
    interrupter.end()

    assert interrupter.abort(JOB) is False
    assert not interrupter.aborted
    assert interrupter.current_job_id is None
    interrupter.checkpoint()


def test_end_forgets_an_abort_and_the_next_job_runs(interrupter: Interrupter, start: Start) -> None:
    interrupter.begin("job-0")
    assert interrupter.abort("job-0") is True
    interrupter.end()
    assert not interrupter.aborted

    job = start(lambda job: job.spin("busy"))
    job.reach("busy")
    # A late abort of the job that ended, or of another job, does not touch this one.
    assert interrupter.abort("job-0") is False
    assert interrupter.abort("job-2") is False
    interrupter.poke()
    job.go_on = True
    job.finish()

    assert job.outcome is None
    assert job.finished_work
