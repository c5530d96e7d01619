"""What a local lane's process runs (capabilities/calls/local_lane.py): one runner.

The lane's processes are forked from a clean fork server, not from Daphne, and run
one capability at a time. A run has no job context of its own: no checkpoints (the
lane kills the process to stop it), no progress, no files (the lane only takes
capabilities whose results are JSON). What comes back is a `runs.Ran`, plain data
pickled to Daphne: the runner's `data`, or a coded error.
"""

from __future__ import annotations

import resource
from typing import Any

from capabilities.protocol import ErrorCode
from capabilities.work import registry, runs
from capabilities.work.context import CapabilityError

MIB = 1024 * 1024


def prepare(memory_limit_mb: int, capabilities: list[str]) -> None:
    """At the process's start: cap its address space, and load the runners once."""
    if memory_limit_mb > 0:
        limit = memory_limit_mb * MIB
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for name in capabilities:
        spec = registry.get(name)
        if spec is not None:
            spec.load_runner()


class NoJob:
    """The context of a local run: nothing to check, report or store."""

    job_id = ""

    def checkpoint(self) -> None:
        """Nothing: the lane stops a run by killing its process."""

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Nothing: local runs are short, and report no progress."""

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> dict[str, Any]:
        raise CapabilityError(
            ErrorCode.OPERATION_FAILED, "This capability cannot run in the local lane."
        )


def run(capability: str, params: dict[str, Any]) -> runs.Ran:
    """The runner's data, or the coded error it came to (plain data, pickled to Daphne)."""
    return runs.run(capability, params, NoJob())
