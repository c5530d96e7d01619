"""Large binary inputs live in Django's storage, not in the job row.

An image sent as base64 is megabytes of text: stored in the row it cost about 67 ms
to insert and 13 ms to read back for a 12 MP photo (SQLite), and it bloated every
query on the table. A `{content: <base64>, ...}` parameter over SPILL_BYTES is
written to storage as it came; the row keeps `content: null` in the params and the
file's name in a column of its own (`Job.spilled`), which agents cannot write. The
worker puts the text back before the runner sees the parameters: runners never know.

Storage is Django's default storage: the filesystem, or an S3 bucket that Daphne
writes to and a worker on another host reads back (docs/operating.md#storage).
Each job's files sit under `inputs/<job id>/`; the worker deletes them when the
work is over, and retention (retention.py) those of jobs that never ran.
"""

from __future__ import annotations

from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

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
    """The params as the agent sent them."""
    restored = dict(params)
    for key, name in _names(job_id, spilled):
        with default_storage.open(name, "rb") as handle:
            text = handle.read().decode("utf-8", "surrogatepass")
        restored[key] = {**params[key], "content": text}
    return restored


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
