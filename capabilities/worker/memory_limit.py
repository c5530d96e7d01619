"""The memory ceiling of a worker child, and what a job that reaches it becomes.

Each prefork child caps its own address space (RLIMIT_AS) when it starts, so a job
that asks for too much memory fails alone instead of starving the host, the other
children and the database. Python code gets a MemoryError, which the worker turns
into a coded failure (OPERATION_FAILED); a C library that aborts on a failed
allocation kills only its own child, and that job is answered WORKER_LOST.

A child that met its ceiling may have left its libraries halfway through something:
it finishes the task it was running, then leaves so that the pool forks a fresh one.

The limit is on virtual size (VmSize), not resident memory: a warmed-up child's is
several times its resident memory (shared libraries, thread stacks and glibc malloc
arenas are reserved but mostly untouched; figures in docs/security.md).
"""

from __future__ import annotations

import resource

from capabilities.conf import abp_settings
from capabilities.protocol import ErrorCode, WireError

MIB = 1024 * 1024

_exhausted = False


def limit_mb() -> int:
    """The configured ceiling in MiB; 0: none."""
    return abp_settings().WORKER_MEMORY_LIMIT_MB


def apply() -> None:
    """Cap this process's address space at the configured ceiling (soft and hard).

    The hard limit goes down too: nothing running in the child can lift it again.
    A hard limit already lower (set by whoever started the worker) is kept.
    """
    limit = limit_mb() * MIB
    if limit <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def error() -> WireError:
    """What the agent is told when its job ran out of memory (not retryable)."""
    limit = limit_mb()
    if limit <= 0:  # no ceiling: the host itself ran out
        return WireError(
            code=ErrorCode.OPERATION_FAILED,
            message="The operation ran out of memory.",
            retryable=False,
        )
    return WireError(
        code=ErrorCode.OPERATION_FAILED,
        message=f"The operation ran out of memory (limit {limit} MiB).",
        details={"limit": "workerMemoryMb", "max": limit},
        retryable=False,
    )


def mark_exhausted() -> None:
    """Remember that this process ran out of memory: it takes no more jobs."""
    global _exhausted  # noqa: PLW0603 - a fact about the whole process
    _exhausted = True


def exhausted() -> bool:
    """Whether this process ran out of memory and should be replaced."""
    return _exhausted
