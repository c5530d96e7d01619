"""What a capability runner sees of its job: checkpoints, progress, file output.

Runners (`pdf`, `images`, ...) take `(params, ctx)` and return the JSON `data` of
the call-result. They never import Celery, Channels or the ORM, so they are tested
with a plain in-memory context (`capabilities.testing.RecordingContext`). Every
context shares its cancel tools (`context_base.ContextBase`).

Exceptions a runner may meet::

    BaseException
     ├── JobAborted         raised by ctx.checkpoint(), or into the thread, on cancel
     └── Exception
          └── CapabilityError   the input is unusable: a stable code, a message, details
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


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


class File(dict[str, Any]):
    """A file the work saved (`ctx.save_file`), to put in its result.

    A reference to the stored bytes (`{"$file": name, "mimeType", "size", "filename"}`)
    that the call-result turns into inline base64 or a download link. As a type hint
    its JSON Schema is that inline-or-download shape (`schemas.binary_result`).
    """

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        # Any mapping goes through as the plain dict it is: the reference stays whole.
        return core_schema.no_info_plain_validator_function(
            dict, serialization=core_schema.plain_serializer_function_ser_schema(dict)
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: Any) -> dict[str, Any]:
        from capabilities.work.schemas import binary_result

        return binary_result({"type": "string"}, "a file")


class JobContext(Protocol):
    """The runner's handle on its job."""

    @property
    def job_id(self) -> str:
        """The job's id (also the Celery task id)."""
        ...

    @property
    def user(self) -> AbstractBaseUser | None:
        """The Django user the call runs for, loaded where it runs; None for a service
        key, an anonymous page, or development mode (docs/your-capabilities.md)."""
        ...

    def checkpoint(self) -> None:
        """Raise JobAborted if the job was cancelled. Costs no I/O: call it often."""
        ...

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Report progress; reaches the agent at once, the DB throttled."""
        ...

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> File:
        """Store output bytes; returns the reference to put in the result data.

        The consumer turns the reference into inline base64 or a download URL.
        """
        ...

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled (or timed out)."""
        ...

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking at once on a cancel; True if cancelled."""
        ...

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call `callback()` on a cancel, from another thread (at once if cancelled)."""
        ...

    def read_bytes(self, value: Any) -> bytes:
        """The bytes of a binary input: BinaryData (base64), or an upload's bytes."""
        ...

    def run_process(
        self, args: str | Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` in a process group of its own, killed on a cancel."""
        ...


Runner = Callable[[dict[str, Any], JobContext], dict[str, Any]]
