"""A user's own jobs, from every door: list them, read one, cancel one.

Every lookup is bound to the user as well as to the id: another user's job is not
found, exactly as one that does not exist (a job's id is a handle, never a
credential). A cancel goes through the one pipeline (`cancellation.cancel`, source
`user`), so the agent that started the job gets its one cancelled call-result and
the work stops. A job already settled is answered as it is, with nothing changed.

Pages are newest first on the index `job_user_created_idx` (user, -created_at),
bounded, and continued with a cursor: the position of a page's last job, not an
offset, so a page stays right while new jobs come in above it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet

from capabilities.endings import cancellation
from capabilities.models import (
    ACTIVE_STATUSES,
    SETTLED_STATUSES,
    CancelSource,
    Job,
    JobStatus,
)

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

PAGE_SIZE = 25
MAX_PAGE_SIZE = 100

# `status=` filters: one status, or either group.
STATUS_FILTERS: dict[str, tuple[JobStatus, ...]] = {
    **{status.value: (status,) for status in JobStatus},
    "active": ACTIVE_STATUSES,
    "settled": SETTLED_STATUSES,
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class JobNotFound(Exception):
    """No job of this user has this id (another user's is not found either)."""


class BadFilter(ValueError):
    """A status filter or a cursor this module cannot read; the message says which."""


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of a user's jobs, newest first."""

    jobs: list[Job]
    next_cursor: str | None
    """Where the next (older) page starts; None on the last page."""


@dataclass(frozen=True, kw_only=True)
class CancelAnswer:
    """What a cancel did: whether this request cancelled the job, and its status now."""

    job_id: uuid.UUID
    cancelled: bool
    status: JobStatus


def owned_by(user: AbstractBaseUser) -> QuerySet[Job]:
    """The user's jobs, with their session (its door), without the large fields."""
    return (
        Job.objects.filter(user_id=user.pk)
        .select_related("session")
        # Inputs can be megabytes; tracebacks are for the admin, never the user.
        .defer("params", "error_traceback")
    )


def list_jobs(
    user: AbstractBaseUser,
    *,
    status: str | None = None,
    limit: int = PAGE_SIZE,
    cursor: str | None = None,
) -> Page:
    """A page of the user's jobs, newest first; BadFilter for a filter or cursor unknown."""
    jobs = owned_by(user)
    if status:
        if status not in STATUS_FILTERS:
            known = ", ".join(STATUS_FILTERS)
            raise BadFilter(f"status must be one of {known}; not {status!r}.")
        jobs = jobs.filter(status__in=STATUS_FILTERS[status])
    if cursor:
        created_at, job_id = _read_cursor(cursor)
        jobs = jobs.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=job_id))
    size = max(1, min(limit, MAX_PAGE_SIZE))
    found = list(jobs.order_by("-created_at", "-id")[: size + 1])
    shown = found[:size]
    more = len(found) > size
    return Page(jobs=shown, next_cursor=_cursor_of(shown[-1]) if more else None)


def get_job(user: AbstractBaseUser, job_id: uuid.UUID) -> Job:
    """One of the user's jobs; JobNotFound if the user has none with this id."""
    job = owned_by(user).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(str(job_id))
    return job


def cancel_job(user: AbstractBaseUser, job_id: uuid.UUID, *, reason: str = "") -> CancelAnswer:
    """Cancel one of the user's jobs (source `user`); JobNotFound if not theirs.

    A job already settled, or one that settles while this cancel is under way, is
    answered `cancelled: False` with its status: nothing about it changes.
    """
    status = _status_of(user, job_id)
    if status is None:
        raise JobNotFound(str(job_id))
    if status in ACTIVE_STATUSES and cancellation.cancel(
        job_id, source=CancelSource.USER, reason=reason
    ):
        return CancelAnswer(job_id=job_id, cancelled=True, status=JobStatus.CANCELLED)
    # Settled already, or by someone else in the meantime: read what it came to.
    now = _status_of(user, job_id)
    return CancelAnswer(job_id=job_id, cancelled=False, status=now or status)


def _status_of(user: AbstractBaseUser, job_id: uuid.UUID) -> JobStatus | None:
    found = Job.objects.filter(pk=job_id, user_id=user.pk).values_list("status", flat=True)
    status = found.first()
    return JobStatus(status) if status is not None else None


def _cursor_of(job: Job) -> str:
    """A job's place in the order: microseconds since the epoch, then its id."""
    return f"{(job.created_at - _EPOCH) // _MICROSECOND}.{job.id.hex}"


def _read_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    micros, _, hex_id = cursor.partition(".")
    try:
        return _EPOCH + int(micros) * _MICROSECOND, uuid.UUID(hex=hex_id)
    except (ValueError, OverflowError):
        raise BadFilter("cursor is not one this API gave out.") from None
