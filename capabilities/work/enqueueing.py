"""Starting a capability's job from Django code: the handle, and the port behind it.

`squares.enqueue(params, user=request.user)` is Django's `task.enqueue()` for a
capability: it returns a `JobHandle` (the job's id, status, result or error; refresh
it, cancel it). The work knows no database, so the calls go through a port: this
module says what it does (`AppCalls`), the app's `ready()` installs the one that
stores jobs (capabilities/calls/app_calls.py), and a test may install a twin.

Exceptions host code meets::

    Exception
     ├── CapabilityError
     │    └── EnqueueRefused    not started, nothing stored: `code` says why
     └── LookupError
          └── JobNotFound       no such job of this user and capability
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from capabilities.protocol import WireError
from capabilities.work.context import CapabilityError

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser

    User = AbstractBaseUser | AnonymousUser | None


class EnqueueRefused(CapabilityError):
    """The job was not started and nothing was stored: `code` and `message` say why,
    as an agent's call would have been refused (PERMISSION_DENIED, INVALID_PARAMS,
    RATE_LIMITED...)."""

    def __init__(self, error: WireError) -> None:
        super().__init__(
            error.code,
            error.message,
            details=error.details,
            retryable=bool(error.to_json()["retryable"]),
        )
        self.retry_after_ms = error.retry_after_ms


class JobNotFound(LookupError):
    """No job with this id, of this capability, for this user (another user's job is
    not found either: an id is a handle, never a credential)."""


@dataclass(frozen=True, kw_only=True)
class JobHandle:
    """A job as it was last read; `refresh()` reads it again, in place.

    Frozen as Django's `TaskResult` is: only `refresh()` (and `cancel()`, which
    refreshes) changes it.
    """

    id: str
    capability: str
    status: str
    """A `capabilities.models.JobStatus` value: queued, running, succeeded, failed, cancelled."""
    result: dict[str, Any] | None = None
    """The result's JSON once succeeded; a file in it is `{"$file": name, ...}` in storage."""
    error: WireError | None = None
    """Why it failed or was cancelled (`code`, `message`); None otherwise."""
    user_id: int | None = None
    """Whose job it is: every read and cancel through this handle is bound to that user."""

    @property
    def is_finished(self) -> bool:
        """Settled: succeeded, failed or cancelled. Nothing changes it after that."""
        return self.status in ("succeeded", "failed", "cancelled")

    def refresh(self) -> None:
        """Read the job again."""
        self._take(port().find(self.capability, self.id, user_id=self.user_id))

    async def arefresh(self) -> None:
        """`refresh`, from async code."""
        self._take(await port().afind(self.capability, self.id, user_id=self.user_id))

    def cancel(self) -> bool:
        """Cancel the job (source "user"), then refresh; True if this cancel settled it.

        The work stops as for an agent's cancel; a job already settled is left as it is.
        """
        cancelled = port().cancel(self.capability, self.id, user_id=self.user_id)
        self.refresh()
        return cancelled

    async def acancel(self) -> bool:
        """`cancel`, from async code."""
        cancelled = await port().acancel(self.capability, self.id, user_id=self.user_id)
        await self.arefresh()
        return cancelled

    def _take(self, fresh: JobHandle) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, getattr(fresh, field.name))


class AppCalls(Protocol):
    """What `.enqueue()` and its handle need of the app: start, read and cancel a job.

    `enqueue` makes every check an agent's call gets, before anything is stored, and
    raises EnqueueRefused; `find` and `cancel` raise JobNotFound. `user`: the user the
    job runs for (`ctx.user`); an anonymous or absent one runs it for nobody.
    """

    def enqueue(
        self, capability: str, params: dict[str, Any], *, user: User, timeout_ms: int | None
    ) -> JobHandle: ...

    async def aenqueue(
        self, capability: str, params: dict[str, Any], *, user: User, timeout_ms: int | None
    ) -> JobHandle: ...

    def find(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle: ...

    async def afind(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle: ...

    def cancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool: ...

    async def acancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool: ...


_installed: AppCalls | None = None


def install(calls: AppCalls | None) -> AppCalls | None:
    """Plug in the app's calls (its `ready()`), or a test's twin; the one it replaces."""
    global _installed
    previous, _installed = _installed, calls
    return previous


def port() -> AppCalls:
    """The installed calls; RuntimeError before the app is ready."""
    if _installed is None:
        raise RuntimeError(
            "A capability's jobs can be started only once Django is set up, with "
            '"capabilities" in INSTALLED_APPS (its ready() plugs in the job store).'
        )
    return _installed


def user_id_of(user: User) -> int | None:
    """The id of a signed-in user; None for nobody (None, or AnonymousUser)."""
    if user is None or not user.is_authenticated:
        return None
    pk: int = user.pk
    return pk
