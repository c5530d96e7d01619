"""How jobs look in the admin: badges, bars, durations, summaries of big values."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from capabilities.jobs.results import FILE_REF_KEY
from capabilities.models import AgentSession, Job, JobStatus

STATUS_COLOURS = {
    JobStatus.QUEUED: "#6c757d",
    JobStatus.RUNNING: "#0d6efd",
    JobStatus.SUCCEEDED: "#198754",
    JobStatus.FAILED: "#dc3545",
    JobStatus.CANCELLED: "#b8860b",
}
# Strings longer than this (base64 inputs) are shown as their size only.
LONG_STRING = 200


def status_badge(status: str, label: str) -> SafeString:
    """The status as a coloured badge."""
    colour = STATUS_COLOURS.get(JobStatus(status), "#333")
    return format_html(
        '<span style="background:{};color:#fff;padding:1px 7px;border-radius:8px;'
        'font-size:11px;white-space:nowrap">{}</span>',
        colour,
        label,
    )


def progress_bar(job: Job) -> SafeString:
    """A bar of the job's progress, with its stage."""
    if job.status == JobStatus.SUCCEEDED:
        percent = 100.0
    elif job.progress is not None and job.progress_total:
        percent = max(0.0, min(100.0, 100.0 * job.progress / job.progress_total))
    else:
        percent = 0.0
    detail = job.stage or ""
    if job.progress is not None and not job.progress_total and job.status == JobStatus.RUNNING:
        detail = f"{detail} {job.progress:g}".strip()
    return format_html(
        '<div style="width:110px;height:8px;background:#e9ecef;border-radius:4px">'
        '<div style="width:{}%;height:8px;background:{};border-radius:4px"></div></div>'
        "<small>{}</small>",
        f"{percent:.0f}",
        STATUS_COLOURS.get(JobStatus(job.status), "#333"),
        detail,
    )


def session_link(session: AgentSession) -> SafeString:
    """The session's agent, linked to the session."""
    url = reverse("admin:capabilities_agentsession_change", args=[session.pk])
    name = session.agent_name or "agent"
    return format_html('<a href="{}">{}</a> <small>{}</small>', url, name, str(session.pk)[:8])


def _span(start: datetime | None, end: datetime | None) -> timedelta | None:
    if start is None:
        return None
    return (end or timezone.now()) - start


def human(duration: timedelta | None) -> str:
    """A duration as ms, s or min."""
    if duration is None:
        return "-"
    seconds = duration.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def time_queued(job: Job) -> str:
    """From the call to the start (or until now, or until it was settled unstarted)."""
    end = job.started_at or (job.settled_at if not job.is_active else None)
    return human(_span(job.created_at, end))


def run_time(job: Job) -> str:
    """From the start to when the work stopped."""
    return human(_span(job.started_at, job.stopped_at or job.settled_at))


def ran_after_cancel(job: Job) -> str:
    """How long the work went on after a cancel settled the job."""
    if job.status != JobStatus.CANCELLED:
        return "-"
    if job.started_at is None:
        return "never started"
    if job.stopped_at is None:
        return "still running"
    suffix = " (killed)" if job.hard_killed else ""
    return human(_span(job.settled_at, job.stopped_at)) + suffix


def timeline(job: Job) -> SafeString:
    """Created, started, settled, stopped, delivered."""
    rows = [
        ("created", job.created_at),
        ("handed to Celery", job.dispatched_at),
        ("started", job.started_at),
        ("settled", job.settled_at),
        ("stopped", job.stopped_at),
        ("delivered", job.delivered_at),
    ]
    cells = SafeString("")
    for label, when in rows:
        offset = "" if when is None else f"+{human(when - job.created_at)}"
        cells += format_html(
            "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", label, when or "-", offset
        )
    return format_html("<table>{}</table>", cells)


def summarize(value: Any, spilled: dict[str, Any] | None = None) -> Any:
    """The value with long strings replaced by their size (never dump base64).

    `spilled`: the job's parameters kept in storage (`Job.spilled`), shown by size.
    """
    if isinstance(value, dict):
        summary = {key: summarize(item) for key, item in value.items()}
        for key, entry in (spilled or {}).items():
            if isinstance(summary.get(key), dict):
                length = entry.get("length", "?")
                summary[key] = {**summary[key], "content": f"<{length} characters in storage>"}
        return summary
    if isinstance(value, list):
        return [summarize(item) for item in value]
    if isinstance(value, str) and len(value) > LONG_STRING:
        return f"<{len(value)} characters: {value[:40]}...>"
    return value


def json_block(value: Any) -> SafeString:
    """A value as indented JSON."""
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


def result(job: Job) -> SafeString:
    """The result data, stored files as download links."""
    if job.result is None:
        return format_html("{}", "-")
    links = SafeString("")
    for key, value in job.result.items():
        if isinstance(value, dict) and FILE_REF_KEY in value:
            url = reverse("admin:capabilities_job_file", args=[job.pk, key])
            links += format_html(
                '<p><a href="{}">{}</a> ({}, {} bytes)</p>',
                url,
                value["filename"],
                value["mimeType"],
                value["size"],
            )
    data = {
        key: f"<file {value['filename']}>" if isinstance(value, dict) and FILE_REF_KEY in value
        else summarize(value)
        for key, value in job.result.items()
    }  # fmt: skip
    return links + json_block(data)
