"""What a capability runner sees of its job: checkpoints, progress, file output.

Runners (`pdf`, `images`, ...) take `(params, ctx)` and return the JSON `data` of
the call-result. They never import Celery, Channels or the ORM, so they are tested
with a plain in-memory context (see `tests/support/context.py`).

Exceptions a runner may meet::

    BaseException
     ├── JobAborted         raised by ctx.checkpoint(), or into the thread, on cancel
     └── Exception
          └── CapabilityError   the input is unusable: a stable code, a message, details
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class JobAborted(BaseException):
    """The job was cancelled; stop now.

    A BaseException, like KeyboardInterrupt, so that the `except Exception` blocks
    inside third-party code (WeasyPrint swallows many) cannot swallow it.
    """


class CapabilityError(Exception):
    """A runner refuses its input or cannot produce output; carries a wire code."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.retryable = retryable


class JobContext(Protocol):
    """The runner's handle on its job."""

    @property
    def job_id(self) -> str:
        """The job's id (also the Celery task id)."""
        ...

    def checkpoint(self) -> None:
        """Raise JobAborted if the job was cancelled. Costs no I/O: call it often."""
        ...

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Report progress; reaches the agent at once, the DB throttled."""
        ...

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> dict[str, Any]:
        """Store output bytes; returns the reference to put in the result data.

        The consumer turns the reference into inline base64 or a download URL.
        """
        ...


Runner = Callable[[dict[str, Any], JobContext], dict[str, Any]]
