"""Stopping a job's work in the worker when its abort flag goes up.

Flags are raised by capabilities/jobs/abort_flags.py. A worker never
polls Redis at checkpoints: a watcher thread subscribed to the channel (the sync
face of capabilities/jobs/abort_listener.py) sets an in-process flag, and raises
`JobAborted` into the task's thread for code without checkpoints (the way Celery's
SIGUSR1 soft time limit raises into a task).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

from capabilities.jobs import abort_listener
from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import JobAborted

logger = logging.getLogger(__name__)

T = TypeVar("T")

# While a job is aborted but still running, the watcher raises again this often.
RERAISE_INTERVAL_SECONDS = 0.005


class Interrupter:
    """The job a worker process is running, and the means to stop it.

    One per process: a prefork child runs one task at a time in its main thread.
    Raising into a thread is only safe in the work itself, so a raise happens only
    while `run` is on that thread's stack, outside `shielded` sections, and not
    while the thread is inside code where an exception would break a lock or an
    import (logging, threading, importlib). The watcher retries until one lands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job_id: str | None = None
        self._thread_id: int | None = None
        self._window: FrameType | None = None
        self._shielded = 0
        # The current job's cancel: ctx.cancelled, wait() and on_cancel() read it.
        self._signal = CancelSignal()

    @property
    def current_job_id(self) -> str | None:
        """The job being run, if any."""
        return self._job_id

    def begin(self, job_id: str) -> None:
        """Register the job this thread is about to run (before checking its flag)."""
        with self._lock:
            self._job_id = job_id
            self._thread_id = threading.get_ident()
            self._signal = CancelSignal()

    def end(self) -> None:
        """Forget the job; later aborts for it do nothing here."""
        with self._lock:
            self._job_id = None
            self._thread_id = None
            self._window = None
            # The ended job's callbacks are never run; the next job gets its own signal.
            self._signal = CancelSignal()

    @property
    def aborted(self) -> bool:
        """Whether the current job was aborted."""
        return self._signal.is_set

    @property
    def signal(self) -> CancelSignal:
        """The current job's cancel."""
        return self._signal

    def checkpoint(self) -> None:
        """Raise JobAborted if the current job was aborted: no I/O."""
        if self._signal.is_set:
            raise JobAborted()

    def abort(self, job_id: str) -> bool:
        """Abort `job_id` if it is the one running here; True if it was.

        The flag and the raise first, then the work's on_cancel callbacks, in this
        (the watcher's) thread, outside the lock.
        """
        with self._lock:
            if job_id != self._job_id:
                return False
            signal = self._signal
        signal.set()
        with self._lock:
            if signal is self._signal:
                self._raise_locked()
        return True

    def poke(self) -> None:
        """Raise again into a job that was aborted and is still inside its work.

        A raise can be swallowed (a destructor, an `except BaseException`), or be
        held back while the thread was somewhere unsafe: retried until the work ends.
        """
        with self._lock:
            if self._signal.is_set:
                self._raise_locked()

    def _raise_locked(self) -> None:
        if self._window is None or self._shielded or self._thread_id is None:
            return
        frame = sys._current_frames().get(self._thread_id)
        if frame is None or not _safe_to_raise(frame, self._window):
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self._thread_id), ctypes.py_object(JobAborted)
        )

    def run(self, work: Callable[[], T]) -> T:
        """Run the job's work: JobAborted may be raised into it from now on."""
        self.checkpoint()
        with self._lock:
            self._window = sys._getframe()
        try:
            return work()
        finally:
            with self._lock:
                self._window = None
                self._clear_pending_locked()

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Hold off raising while the job's own bookkeeping (DB, storage) runs."""
        with self._lock:
            self._shielded += 1
            self._clear_pending_locked()
        try:
            yield
        finally:
            with self._lock:
                self._shielded -= 1
        self.checkpoint()

    def _clear_pending_locked(self) -> None:
        # Drop an exception raised but not delivered yet: it must not fire outside
        # the work it was meant to stop.
        if self._thread_id is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)


# Where an exception raised from outside breaks more than the work: between a lock's
# acquire() and its try (logging), inside threading primitives, halfway through an
# import, or in an event loop's own machinery (an `async def` capability is stopped by
# cancelling its task; a raise lands only in its own code).
_UNSAFE_FILES = (
    f"{os.sep}logging{os.sep}",
    f"{os.sep}threading.py",
    f"{os.sep}queue.py",
    f"{os.sep}asyncio{os.sep}",
    f"{os.sep}selectors.py",
    "<frozen importlib",
    __file__,
)


def _safe_to_raise(frame: FrameType, window: FrameType) -> bool:
    """Whether the thread at `frame` is inside the work window, at a safe spot."""
    filename = frame.f_code.co_filename
    if any(part in filename for part in _UNSAFE_FILES):
        return False
    current: FrameType | None = frame
    while current is not None:
        if current is window:
            return True
        current = current.f_back
    return False


INTERRUPTER = Interrupter()


_watcher: abort_listener.ListenerThread | None = None


def _quiet_unraisable_aborts(default: Callable[[Any], None]) -> Callable[[Any], None]:
    """An unraisablehook that drops JobAborted.

    A raise that lands in a destructor (cffi's finalizers in WeasyPrint) is
    "unraisable": Python prints it and goes on, and the watcher raises again. Printing
    it would take logging's locks exactly where a raise can land, so it is dropped.
    """

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not JobAborted:
            default(unraisable)

    return hook


def start_watcher() -> abort_listener.ListenerThread:
    """Start this process's watcher once (called in each worker child after fork)."""
    global _watcher  # noqa: PLW0603 - one watcher per process
    if _watcher is None or not _watcher.is_alive():
        sys.unraisablehook = _quiet_unraisable_aborts(sys.unraisablehook)
        _watcher = abort_listener.ListenerThread(
            abort_listener.AbortListener("abp-abort-watcher", _running, INTERRUPTER.abort),
            wait=_next_wait,
            tick=INTERRUPTER.poke,
        )
        _watcher.start()
    return _watcher


def _running() -> list[str]:
    job_id = INTERRUPTER.current_job_id
    return [] if job_id is None else [job_id]


def _next_wait() -> float:
    # While a job is aborted but still running, raise again soon (`tick`: `poke`).
    return RERAISE_INTERVAL_SECONDS if INTERRUPTER.aborted else abort_listener.IDLE_WAKE_SECONDS
