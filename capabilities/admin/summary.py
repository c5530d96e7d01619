"""The changelist's summary: the last hour by status, run times per capability."""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from capabilities.models import Job, JobStatus

WINDOW = timedelta(hours=1)
# Run times are read for at most this many recent jobs per capability.
SAMPLE = 5000


def changelist_summary() -> dict[str, Any]:
    """Counts by status, and median / p95 run time per capability, over the last hour."""
    since = timezone.now() - WINDOW
    recent = Job.objects.filter(created_at__gte=since)
    counts = dict(recent.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    by_status = [(JobStatus(s).label, counts.get(s, 0)) for s in JobStatus.values]
    timings = []
    capabilities = recent.order_by().values_list("capability", flat=True).distinct()
    for capability in sorted(capabilities):
        rows = (
            recent.filter(capability=capability, started_at__isnull=False, stopped_at__isnull=False)
            .order_by("-created_at")
            .values_list("started_at", "stopped_at")[:SAMPLE]
        )
        seconds = sorted((stop - start).total_seconds() for start, stop in rows if start and stop)
        if seconds:
            timings.append(
                {
                    "capability": capability,
                    "count": len(seconds),
                    "median_ms": statistics.median(seconds) * 1000,
                    "p95_ms": seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))] * 1000,
                }
            )
    return {"by_status": by_status, "timings": timings, "total": sum(counts.values())}
