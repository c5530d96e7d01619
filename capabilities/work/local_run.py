"""What a local lane's process runs (capabilities/calls/local_lane.py): one runner.

The lane's processes are forked from a clean fork server, not from Daphne, and run
one capability at a time. A run has no job context of its own: no checkpoints (the
lane kills the process to stop it), no progress, no files (the lane only takes
capabilities whose results are JSON). What comes back is plain data, pickled to
Daphne: the runner's `data`, or a coded error.
"""

from __future__ import annotations

import resource
import traceback
from typing import Any

from capabilities.protocol import ErrorCode
from capabilities.work import registry
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


def run(capability: str, params: dict[str, Any]) -> dict[str, Any]:
    """`{"data": ...}`, or `{"error": {code, message, details, retryable}, "traceback"?}`."""
    spec = registry.get(capability)
    if spec is None:
        return _error(ErrorCode.UNKNOWN_CAPABILITY, "Capability no longer exists.")
    try:
        return {"data": spec.load_runner()(params, NoJob())}
    except CapabilityError as exc:
        return _error(exc.code, exc.message, details=exc.details, retryable=exc.retryable)
    except MemoryError as exc:
        traceback.clear_frames(exc.__traceback__)
        return _error(ErrorCode.OPERATION_FAILED, "The operation ran out of memory.")
    except Exception:
        failed = _error(ErrorCode.OPERATION_FAILED, "The operation failed; the error was recorded.")
        return {**failed, "traceback": traceback.format_exc()}


def _error(
    code: str, message: str, *, details: dict[str, Any] | None = None, retryable: bool = False
) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details, "retryable": retryable}}
