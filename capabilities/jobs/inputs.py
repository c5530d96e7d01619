"""Large binary inputs live in Django's storage, not in the job row.

An image sent as base64 is megabytes of text: stored in the row, it would slow the
row's insert and every read of it, and bloat every query on the table
(docs/benchmarks.md, "Other measurements"). A `{content: <base64>, ...}` parameter
over SPILL_BYTES is written to storage as it came; the row keeps `content: null` in
the params and the file's name in a column of its own (`Job.spilled`), which agents
cannot write. The worker puts the text back before the runner sees the parameters:
runners never know.

Storage is Django's default storage: the filesystem, or an S3 bucket that Daphne
writes to and a worker on another host reads back (docs/operating.md#storage).
Each job's files sit under `inputs/<job id>/`; the worker deletes them when the
work is over, and retention (retention.py) those of jobs that never ran.

A parameter passed as an upload reference (`{uploadId}`, jobs/uploads.py) is read
back here too, as bytes: the runner gets `content` as `bytes` and decodes no base64.
An upload the call may not use (another session's, expired when the call was made,
or gone) becomes a `CapabilityError` in place of the content, which the runner
raises: the call then fails with INVALID_PARAMS and the reference's path, as the
call checks would have refused it. Uploads are not deleted after the work: a session
may name one in several calls until it expires.
"""

from __future__ import annotations

from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from capabilities.jobs import uploads
from capabilities.models import Job
from capabilities.protocol import ErrorCode
from capabilities.work.context import CapabilityError

INPUTS_DIR = "inputs"
SPILL_BYTES = 64 * 1024

# The parameter's name -> {"name": file name in storage, "length": characters}.
Spilled = dict[str, dict[str, Any]]


def spill(job_id: str, params: dict[str, Any]) -> tuple[dict[str, Any], Spilled]:
    """The params to store in the row, large contents moved to storage, and where."""
    stored = dict(params)
    spilled: Spilled = {}
    for key, value in params.items():
        content = value.get("content") if isinstance(value, dict) else None
        if isinstance(content, str) and len(content) > SPILL_BYTES:
            name = default_storage.save(
                f"{_folder(job_id)}{key}.txt",
                ContentFile(content.encode("utf-8", "surrogatepass")),
            )
            stored[key] = {**value, "content": None}
            spilled[key] = {"name": name, "length": len(content)}
    return stored, spilled


def restore(job_id: str, params: dict[str, Any], spilled: Spilled) -> dict[str, Any]:
    """The params as the agent sent them; uploads named by reference, as bytes."""
    restored = dict(params)
    for key, name in _names(job_id, spilled):
        with default_storage.open(name, "rb") as handle:
            text = handle.read().decode("utf-8", "surrogatepass")
        restored[key] = {**params[key], "content": text}
    referenced = list(uploads.references(params))
    if referenced:
        session_id, created_at = Job.objects.values_list("session_id", "created_at").get(pk=job_id)
        for key, upload_id in referenced:
            content = _uploaded(key, upload_id, str(session_id), created_at.timestamp())
            restored[key] = {**params[key], "content": content}
    return restored


def _uploaded(
    key: str, upload_id: str, session_id: str, called_at: float
) -> bytes | CapabilityError:
    """An upload's bytes, or the error the runner raises for a reference it may not use."""
    path = f"params.{key}.{uploads.REFERENCE_KEY}"
    try:
        return uploads.read(uploads.resolve(upload_id, session_id, at=called_at))
    except uploads.UploadRefused as refused:
        message = str(refused)
    except FileNotFoundError:
        message = "This upload is no longer kept; upload the bytes again."
    return CapabilityError(ErrorCode.INVALID_PARAMS, message, details={"path": path})


def discard(job_id: str, spilled: Spilled) -> None:
    """Delete a job's spilled inputs (once its work is over)."""
    for _, name in _names(job_id, spilled):
        default_storage.delete(name)


def _folder(job_id: str) -> str:
    return f"{INPUTS_DIR}/{job_id}/"


def _names(job_id: str, spilled: Spilled) -> list[tuple[str, str]]:
    """Each spilled parameter's file, refusing any outside this job's own folder."""
    names = [(key, str(entry["name"])) for key, entry in spilled.items()]
    for _, name in names:
        if not name.startswith(_folder(job_id)) or ".." in name:
            raise ValueError(f"spilled input {name!r} is not in job {job_id}'s folder")
    return names
