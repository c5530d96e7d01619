"""Turn a settled job into the ABPResponse of its call-result.

Runners store binary output in Django's storage and put a `{"$file": name, ...}`
reference in their data; here it becomes inline base64 (BinaryData) up to
INLINE_RESULT_MAX_BYTES, and a signed, expiring download URL above.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from django.core.files.storage import default_storage
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.jobs import download_links
from capabilities.jobs.lifecycle import Outcome
from capabilities.models import Job, JobStatus
from capabilities.protocol import WireError, responses

FILE_REF_KEY = "$file"
# A settled note may carry its call's whole response up to this size (JSON bytes):
# the consumer then answers without reading the DB. Larger ones, and any with
# files, are read by the consumer.
NOTE_RESPONSE_MAX_BYTES = 16 * 1024


def call_response(
    job: Job, *, base_url: str = "", inline_max_bytes: int | None = None
) -> dict[str, Any]:
    """The ABPResponse for a settled job; download URLs start with `base_url`.

    Files up to `inline_max_bytes` (INLINE_RESULT_MAX_BYTES if None) are inlined.
    """
    succeeded = job.status == JobStatus.SUCCEEDED
    data = materialize(job, base_url=base_url, inline_max_bytes=inline_max_bytes)
    return _response(
        job.call_id,
        JobStatus(job.status),
        data=data if succeeded else None,
        error=None if succeeded else job_error(job),
        duration=duration_ms(job),
    )


def outcome_response(job: Job, outcome: Outcome) -> dict[str, Any]:
    """The ABPResponse of an outcome this process settles now (no DB read).

    Result files are not inlined here: see `inline_response`.
    """
    return _response(
        job.call_id,
        outcome.status,
        data=outcome.result or {},
        error=outcome.error,
        duration=duration_ms(job, settled_at=timezone.now()),
    )


def inline_response(job: Job, outcome: Outcome) -> dict[str, Any] | None:
    """The response of a job the worker just settled, if small and file-free."""
    if outcome.result is not None and any(_is_file_ref(v) for v in outcome.result.values()):
        return None
    response = outcome_response(job, outcome)
    if len(json.dumps(response)) > NOTE_RESPONSE_MAX_BYTES:
        return None
    return response


def _response(
    call_id: str,
    status: JobStatus,
    *,
    data: dict[str, Any] | None,
    error: WireError | None,
    duration: int,
) -> dict[str, Any]:
    if status == JobStatus.SUCCEEDED:
        return responses.succeeded(call_id, data or {}, duration)
    assert error is not None
    return responses.failed(call_id, error, duration, cancelled=status == JobStatus.CANCELLED)


def job_error(job: Job) -> WireError:
    """The wire error recorded on a job."""
    return WireError(
        code=job.error_code,
        message=job.error_message,
        retryable=job.error_retryable,
        details=job.error_details or None,
    )


def duration_ms(job: Job, *, settled_at: datetime | None = None) -> int:
    """Milliseconds from the call to its outcome: a call-result's `metadata.duration`.

    `settled_at`: when the outcome was decided, for one this process settles now
    (`timezone.now()`); by default the job's own `settled_at`, 0 while it has none.
    """
    end = job.settled_at if settled_at is None else settled_at
    if end is None:
        return 0
    return max(0, int((end - job.created_at).total_seconds() * 1000))


def materialize(job: Job, *, base_url: str, inline_max_bytes: int | None = None) -> dict[str, Any]:
    """The job's result data, its file references made BinaryData or references."""
    data: dict[str, Any] = job.result or {}
    limit = abp_settings().INLINE_RESULT_MAX_BYTES if inline_max_bytes is None else inline_max_bytes
    return {
        key: _binary(job, value, base_url, limit) if _is_file_ref(value) else value
        for key, value in data.items()
    }


def _is_file_ref(value: Any) -> bool:
    return isinstance(value, dict) and FILE_REF_KEY in value


def _binary(job: Job, ref: dict[str, Any], base_url: str, limit: int) -> dict[str, Any]:
    if ref["size"] > limit:
        return download_links.reference(job, ref, base_url=base_url)
    with default_storage.open(ref[FILE_REF_KEY], "rb") as handle:
        content = handle.read()
    return {
        "content": base64.b64encode(content).decode("ascii"),
        "mimeType": ref["mimeType"],
        "encoding": "base64",
        "size": len(content),
        "filename": ref["filename"],
    }
