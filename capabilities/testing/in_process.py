"""Run a capability in-process, as a test would: `run_capability` and `RecordingContext`.

No worker, no database, no Redis: the params go through the registry's validation (a
bad one raises the `CapabilityError` an agent would be answered with), then the
capability runs in this thread with a context that records what it reported and
saved, and that can cancel it at its Nth checkpoint (docs/your-capabilities.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.exceptions import AppRegistryNotReady

from capabilities.access import permissions
from capabilities.protocol import ErrorCode
from capabilities.work import extras, registry
from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import CapabilityError, File, JobAborted
from capabilities.work.context_base import ContextBase

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


@dataclass(frozen=True, kw_only=True)
class Progress:
    """One `ctx.report(...)`."""

    progress: float
    total: float | None
    stage: str


class RecordingContext(ContextBase):
    """A JobContext that records reports, checkpoints and files, and cancels on demand.

    `cancel_at_checkpoint=N`: the Nth call to `checkpoint()` finds the job cancelled
    and raises `JobAborted`, as a cancel arriving just before it would. `cancel()`
    cancels it now (from any thread): `cancelled`, `wait()` and `on_cancel` see it.
    Files are kept by file name (`files`), and the name is the reference's `$file`.
    """

    def __init__(
        self,
        *,
        job_id: str = "test-job",
        cancel_at_checkpoint: int | None = None,
        user: AbstractBaseUser | None = None,
    ):
        self.job_id = job_id
        self.user = user
        self.cancel_at_checkpoint = cancel_at_checkpoint
        self.checkpoints = 0
        self.progress: list[Progress] = []
        self.files: dict[str, bytes] = {}
        self._signal = CancelSignal()

    @property
    def cancel_signal(self) -> CancelSignal:
        """Set by `cancel()`, or at the checkpoint named."""
        return self._signal

    def cancel(self) -> None:
        """Cancel the job now: the next checkpoint raises, waits wake, callbacks run."""
        self._signal.set()

    def checkpoint(self) -> None:
        """Count the checkpoint; raise JobAborted if the job is cancelled by now."""
        self.checkpoints += 1
        if self.cancel_at_checkpoint is not None and self.checkpoints >= self.cancel_at_checkpoint:
            self._signal.set()
        if self._signal.is_set:
            raise JobAborted()

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        """Record the report."""
        self.progress.append(Progress(progress=progress, total=total, stage=stage))

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> File:
        """Keep the bytes under their file name (made unique: `a.csv`, `a-2.csv`)."""
        name = filename
        path = PurePosixPath(filename)
        count = 1
        while name in self.files:
            count += 1
            name = f"{path.stem}-{count}{path.suffix}"
        self.files[name] = data
        return File({"$file": name, "mimeType": mime_type, "size": len(data), "filename": filename})


@dataclass(kw_only=True)
class CapabilityRun:
    """What a run came to: its JSON result (None if cancelled) and what it recorded."""

    result: dict[str, Any] | None
    cancelled: bool
    checkpoints: int
    progress: list[Progress] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


def _unknown(name: str) -> str:
    built_in = extras.BUILT_INS.get(name)
    if built_in is not None:
        return f"Unknown capability {name!r}: its extra is not installed ({built_in.install_line})."
    return f"Unknown capability {name!r}."


def run_capability(
    name: str,
    params: dict[str, Any],
    *,
    cancel_at_checkpoint: int | None = None,
    user: AbstractBaseUser | None = None,
) -> CapabilityRun:
    """Validate `params` as a call's are, run capability `name` here, and record it.

    A refused param raises `CapabilityError` with the code an agent would get; so does
    the capability's own refusal, and a `user` (its `ctx.user`) without a permission
    the capability requires, or whom its `authorize` check refuses (PERMISSION_DENIED).
    Any other exception is raised as it is. Capabilities are registered when Django
    starts: before that, `AppRegistryNotReady` says so.
    """
    if not apps.ready:
        raise AppRegistryNotReady(
            f"run_capability({name!r}) needs Django set up: capabilities are registered "
            "when the app registry is ready. Run it under pytest-django (pip install "
            "pytest-django, DJANGO_SETTINGS_MODULE set), or call django.setup() first."
        )
    spec = registry.get(name)
    if spec is None:
        raise CapabilityError(ErrorCode.UNKNOWN_CAPABILITY, _unknown(name))
    refused = spec.validate(params)
    if refused is not None:
        raise CapabilityError(
            refused.code,
            refused.message,
            details=refused.details,
            retryable=bool(refused.retryable),
        )
    denied = permissions.call_refusal(spec, user, params)
    if denied is not None:
        raise CapabilityError(denied.code, denied.message, details=denied.details)
    ctx = RecordingContext(cancel_at_checkpoint=cancel_at_checkpoint, user=user)
    runner = spec.load_runner()
    try:
        result: dict[str, Any] | None = runner(params, ctx)
    except JobAborted:
        result = None
    return CapabilityRun(
        result=result,
        cancelled=ctx.cancelled,
        checkpoints=ctx.checkpoints,
        progress=ctx.progress,
        files=ctx.files,
    )
