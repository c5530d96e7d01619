"""A user's job as "Your jobs" shows it, on its page and in its JSON API.

Small by construction: a result's files are signed download links (never their
bytes, whatever their size), its other values one short JSON summary, and an
error its code and message. Inputs and tracebacks are never shown.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.jobs import download_links
from capabilities.jobs.results import FILE_REF_KEY
from capabilities.models import Job

# A result's values other than files, as JSON text, are cut to this many characters.
SUMMARY_CHARACTERS = 300
# Strings longer than this (an HTML page, base64) are shown by their length alone.
LONG_STRING = 80


def job_json(job: Job, *, base_url: str) -> dict[str, Any]:
    """The job as the API answers it; download URLs start with `base_url`."""
    return {
        "id": str(job.id),
        "callId": job.call_id,
        "capability": job.capability,
        "door": job.session.door,
        "client": job.client,
        "status": job.status,
        "active": job.is_active,
        "progress": job.progress,
        "progressTotal": job.progress_total,
        "stage": job.stage,
        "createdAt": _iso(job.created_at),
        "startedAt": _iso(job.started_at),
        "settledAt": _iso(job.settled_at),
        "result": result_json(job, base_url=base_url),
        "error": _error(job),
        "cancelSource": job.cancel_source or None,
        "url": reverse("abp-your-job-json", args=[job.id]),
        "cancelUrl": reverse("abp-your-job-cancel", args=[job.id]),
    }


def result_json(job: Job, *, base_url: str) -> dict[str, Any] | None:
    """`{files, summary}` of a result, or None for a job without one."""
    if job.result is None:
        return None
    kept = _files_kept(job)
    files = [
        _file(job, name, ref, base_url=base_url, kept=kept)
        for name, ref in job.result.items()
        if _is_file(ref)
    ]
    others = {name: _short(value) for name, value in job.result.items() if not _is_file(value)}
    return {"files": files, "summary": summary(others) if others else ""}


def summary(value: Any) -> str:
    """Values as JSON text, cut to SUMMARY_CHARACTERS."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= SUMMARY_CHARACTERS:
        return text
    return text[: SUMMARY_CHARACTERS - 1] + "…"


def _file(job: Job, name: str, ref: dict[str, Any], *, base_url: str, kept: bool) -> dict[str, Any]:
    if not kept:
        # Its links would answer 410: say so instead of handing one out.
        described = {key: ref[key] for key in ("filename", "mimeType", "size")}
        return {"name": name, **described, "downloadUrl": None, "gone": True}
    return {"name": name, **download_links.reference(job, ref, base_url=base_url), "gone": False}


def _files_kept(job: Job) -> bool:
    """Whether the result's files are still kept (RESULT_RETENTION_SECONDS)."""
    if job.settled_at is None:
        return True
    kept_for = timedelta(seconds=abp_settings().RESULT_RETENTION_SECONDS)
    return timezone.now() < job.settled_at + kept_for


def _is_file(value: Any) -> bool:
    return isinstance(value, dict) and FILE_REF_KEY in value


def _short(value: Any) -> Any:
    """The value with long strings replaced by their length."""
    if isinstance(value, dict):
        return {key: _short(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_short(item) for item in value]
    if isinstance(value, str) and len(value) > LONG_STRING:
        return f"<{len(value)} characters>"
    return value


def _error(job: Job) -> dict[str, Any] | None:
    if not job.error_code:
        return None
    return {"code": job.error_code, "message": job.error_message, "retryable": job.error_retryable}


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")
