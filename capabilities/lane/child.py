"""What a lane process runs (the pool is lane/pool.py): one runner at a time.

The lane's processes are forked from a clean fork server, not from Daphne, and run
one capability at a time. A run has no job context of its own: no checkpoints (the
lane kills the process to stop it), no progress, no files (the lane only takes
capabilities whose results are JSON). What comes back is a `runs.Ran`, plain data
pickled to Daphne: the runner's `data`, or a coded error.
"""

from __future__ import annotations

import os
import resource
from multiprocessing.connection import Connection
from typing import Any

import django
from django.apps import apps

from capabilities.protocol import ErrorCode
from capabilities.work import registry, runs
from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import CapabilityError, File
from capabilities.work.context_base import ContextBase
from capabilities.work.users import load_user

MIB = 1024 * 1024


def prepare(memory_limit_mb: int, capabilities: list[str]) -> None:
    """At the process's start: cap its address space, and load and warm up the runners once."""
    if memory_limit_mb > 0:
        limit = memory_limit_mb * MIB
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # A process from the fork server starts with no app loaded: the registry is
    # filled by the apps' start-up (abp_capabilities modules), and capabilities of
    # one's own may use the ORM.
    if not apps.ready:
        django.setup()
    for name in capabilities:
        spec = registry.get(name)
        if spec is not None:
            spec.prepare()


class NoJob(ContextBase):
    """The context of a local run: nothing to check, report or store.

    Its cancel is never set: the lane stops a run by killing its process (a program
    started with `run_process` is then left to finish on its own).
    """

    job_id = ""

    def __init__(self) -> None:
        self._signal = CancelSignal()

    @property
    def cancel_signal(self) -> CancelSignal:
        """Never set."""
        return self._signal

    def checkpoint(self) -> None:
        """Nothing: the lane stops a run by killing its process."""

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Nothing: local runs are short, and report no progress."""

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> File:
        raise CapabilityError(
            ErrorCode.OPERATION_FAILED, "This capability cannot run in the local lane."
        )


def run(capability: str, params: dict[str, Any], user_id: int | None = None) -> runs.Ran:
    """The runner's data, or the coded error it came to (plain data, pickled to Daphne).

    `user_id`: the user it runs for, loaded here as `ctx.user` (its permissions were
    checked as the call started, a moment ago).
    """
    context = NoJob()
    context.user = load_user(user_id)
    return runs.run(capability, params, context)


def serve(conn: Connection, memory_limit_mb: int, capabilities: list[str]) -> None:
    """A lane process's life: prepare, say so, then run what comes, one at a time.

    It ends when Daphne's end of the pipe does: Daphne went, or gave up on it.
    """
    prepare(memory_limit_mb, capabilities)
    conn.send(os.getpid())
    while True:
        try:
            capability, params, user_id = conn.recv()
        except EOFError:
            return
        conn.send(run(capability, params, user_id))
