"""Run a capability's runner, and turn what it raised into a coded error.

The one place a runner is called, for the worker (capabilities/worker/executor.py)
and the local lane's processes (lane/child.py) alike. What comes back is a `Ran`:
the runner's data, or the error its agent is told, with the traceback of anything
unexpected for the log and the admin (never for the wire). The caller makes it an
outcome (`lifecycle.Outcome.of_run`).

`JobAborted` (a BaseException) is never caught here: it means the job was cancelled,
and whoever cancelled it settled it already.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capabilities.protocol import ErrorCode, WireError
from capabilities.work import registry
from capabilities.work.context import CapabilityError, JobContext

Work = Callable[[], dict[str, Any]]

UNKNOWN_CAPABILITY = WireError(
    code=ErrorCode.UNKNOWN_CAPABILITY, message="Capability no longer exists."
)
OUT_OF_MEMORY = WireError(
    code=ErrorCode.OPERATION_FAILED, message="The operation ran out of memory.", retryable=False
)
CRASHED = WireError(
    code=ErrorCode.OPERATION_FAILED, message="The operation failed; the error was recorded."
)


@dataclass(frozen=True, kw_only=True)
class Ran:
    """What a run came to: the runner's `data`, or the `error` to answer (plain, picklable)."""

    data: dict[str, Any] | None = None
    error: WireError | None = None
    traceback: str = ""
    out_of_memory: bool = False

    @property
    def crashed(self) -> bool:
        """Whether the runner raised something unexpected (its traceback says what)."""
        return bool(self.traceback) and not self.out_of_memory


def _call(work: Work) -> dict[str, Any]:
    return work()


def run(
    capability: str,
    params: dict[str, Any],
    context: JobContext,
    *,
    within: Callable[[Work], dict[str, Any]] = _call,
    passing: tuple[type[BaseException], ...] = (),
    out_of_memory: WireError = OUT_OF_MEMORY,
) -> Ran:
    """Run `capability`'s runner on `params`; its data, or the error to answer.

    `within` calls the runner (the worker's interrupter may raise into it only there);
    `passing`: exceptions raised on, for the caller (Celery's soft time limit);
    `out_of_memory`: the error a MemoryError becomes (the worker names its ceiling).
    """
    spec = registry.get(capability)
    if spec is None:  # the registry changed under a queued job
        return Ran(error=UNKNOWN_CAPABILITY)
    try:
        runner = spec.load_runner()
        data = within(lambda: runner(params, context))
    except passing:
        raise
    except CapabilityError as exc:
        return Ran(
            error=WireError(
                code=exc.code, message=exc.message, details=exc.details, retryable=exc.retryable
            )
        )
    except MemoryError as exc:
        # Free what the runner's frames hold before formatting anything.
        traceback.clear_frames(exc.__traceback__)
        return Ran(error=out_of_memory, traceback=traceback.format_exc(), out_of_memory=True)
    except Exception:
        return Ran(error=CRASHED, traceback=traceback.format_exc())
    return Ran(data=data)
