"""The Workers page: each live worker with its jobs, and each queue with its backlog.

Like Flower's worker list, read from what the workers announce in Redis
(capabilities/jobs/workers.py) rather than by asking them, so a busy or dead
worker cannot make the page wait. Reached from the Jobs changelist, at
/admin/capabilities/job/workers/.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import redis
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from capabilities.conf import abp_settings
from capabilities.jobs import workers
from capabilities.jobs.queue import queue_for
from capabilities.models import ACTIVE_STATUSES, Job, JobStatus
from capabilities.work import registry


@dataclass(frozen=True, kw_only=True)
class RunningJob:
    """A job a worker says it runs, and its row (None if the database has none)."""

    id: str
    job: Job | None


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    """One live worker and the jobs it runs."""

    worker: workers.LiveWorker
    jobs: tuple[RunningJob, ...]


@dataclass(frozen=True, kw_only=True)
class QueueRow:
    """One queue: the capabilities routed to it, its live slots, its jobs in the database."""

    name: str
    capabilities: tuple[str, ...]
    slots: int | None  # None: Redis did not answer, so nobody knows
    waiting: int
    dispatched: int


@dataclass(frozen=True, kw_only=True)
class Overview:
    """What the page shows; `workers` is None when Redis did not answer."""

    workers: tuple[WorkerRow, ...] | None
    queues: tuple[QueueRow, ...]

    @property
    def unavailable(self) -> tuple[str, ...]:
        """Capabilities whose queue no live worker consumes."""
        return tuple(name for row in self.queues if row.slots == 0 for name in row.capabilities)


def overview(live: list[workers.LiveWorker] | None) -> Overview:
    """The page's data for these live workers (None: unknown), in two queries."""
    rows = None if live is None else tuple(_worker_rows(live))
    return Overview(workers=rows, queues=tuple(_queue_rows(live)))


def _worker_rows(live: list[workers.LiveWorker]) -> list[WorkerRow]:
    ids = {
        job_uuid
        for worker in live
        for job_id in worker.jobs
        if (job_uuid := _uuid(job_id)) is not None
    }
    rows = Job.objects.filter(pk__in=ids).only("id", "call_id", "capability", "status")
    found = {str(job.pk): job for job in rows}
    return [
        WorkerRow(
            worker=worker,
            jobs=tuple(
                RunningJob(id=job_id, job=found.get(_uuid(job_id) or "")) for job_id in worker.jobs
            ),
        )
        for worker in live
    ]


def _uuid(text: str) -> str | None:
    # A job id is a UUID; anything else in a worker's key matches no row.
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _queue_rows(live: list[workers.LiveWorker] | None) -> list[QueueRow]:
    routed: dict[str, list[str]] = {}
    for spec in registry.all_specs():
        routed.setdefault(queue_for(spec.name), []).append(spec.name)
    counts = {
        row["queue"]: row
        for row in Job.objects.filter(status__in=ACTIVE_STATUSES)
        .exclude(queue="")
        .order_by()
        .values("queue")
        .annotate(
            waiting=Count("id", filter=Q(status=JobStatus.QUEUED, dispatched_at__isnull=True)),
            dispatched=Count("id", filter=Q(dispatched_at__isnull=False)),
        )
    }
    abp = abp_settings()
    names = {
        *abp.QUEUES.names(),
        *abp.CAPABILITY_QUEUES.values(),
        *routed,
        *counts,  # jobs routed by a setting since changed still wait somewhere
        *(queue for worker in live or () for queue in worker.queues),
    }
    slots = None if live is None else workers.capacity(live)
    empty: dict[str, Any] = {"waiting": 0, "dispatched": 0}
    return [
        QueueRow(
            name=name,
            capabilities=tuple(routed.get(name, ())),
            slots=None if slots is None else slots.get(name, 0),
            waiting=counts.get(name, empty)["waiting"],
            dispatched=counts.get(name, empty)["dispatched"],
        )
        for name in sorted(names)
    ]


def page(request: HttpRequest, model_admin: admin.ModelAdmin[Job]) -> TemplateResponse:
    """The Workers page, for those who may view jobs."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    try:
        live: list[workers.LiveWorker] | None = workers.live_workers()
        redis_error = ""
    except redis.RedisError as error:
        # The page is where an operator looks when things break: say so, don't 500.
        live, redis_error = None, type(error).__name__
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Workers",
        "opts": Job._meta,
        "overview": overview(live),
        "redis_error": redis_error,
        "announce_seconds": abp_settings().WORKER_ANNOUNCE_SECONDS,
        "ttl_seconds": abp_settings().WORKER_TTL_SECONDS,
    }
    return TemplateResponse(request, "admin/capabilities/workers.html", context)


def url(model_admin: admin.ModelAdmin[Job]) -> URLPattern:
    """The page's URL under the Job admin's (before its catch-all), staff only."""

    def view(request: HttpRequest) -> TemplateResponse:
        return page(request, model_admin)

    return path(
        "workers/", model_admin.admin_site.admin_view(view), name="capabilities_job_workers"
    )
