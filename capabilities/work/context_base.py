"""What every JobContext does the same way: its cancel tools, and reading binary inputs.

The worker's context, the local lane's and the recording one of
`capabilities.testing` differ in how they check, report and store; they share this.
"""

from __future__ import annotations

import abc
import base64
import binascii
import subprocess
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from capabilities.protocol import ErrorCode
from capabilities.work import processes
from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import CapabilityError

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


class ContextBase(abc.ABC):
    """`cancelled`, `wait`, `on_cancel`, `run_process` over a `CancelSignal`; `read_bytes`;
    `user`, loaded by whoever runs the job before the work starts."""

    user: AbstractBaseUser | None = None

    @property
    @abc.abstractmethod
    def cancel_signal(self) -> CancelSignal:
        """This job's cancel (each context says where it comes from)."""

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled (or timed out)."""
        return self.cancel_signal.is_set

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking at once on a cancel; True if cancelled."""
        return self.cancel_signal.wait(seconds)

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call `callback()` on a cancel, from the thread that hears of it."""
        self.cancel_signal.add(callback)

    def run_process(
        self, args: str | Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` in a process group of its own, killed on a cancel."""
        return processes.run_process(args, self.cancel_signal, **kwargs)

    def read_bytes(self, value: Any) -> bytes:
        """The bytes of a binary input: BinaryData's base64, or an upload's bytes."""
        return read_bytes(value)


def read_bytes(value: Any) -> bytes:
    """The bytes of a binary input (`schemas.binary_input`), or of bare base64 text.

    Uploads were read before the work started (`jobs/inputs.py`): their `content` is
    bytes already, or the CapabilityError the reference came to, raised here.
    """
    content = value.get("content") if isinstance(value, dict) else value
    if isinstance(content, CapabilityError):
        raise content
    if isinstance(content, bytes | bytearray):
        return bytes(content)
    if isinstance(content, str):
        try:
            return base64.b64decode("".join(content.split()), validate=True)
        except (binascii.Error, ValueError):
            pass
    raise CapabilityError(ErrorCode.INVALID_PARAMS, "A binary input is not valid base64.")
