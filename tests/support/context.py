"""An in-memory JobContext: records reports and files, aborts on demand."""

from __future__ import annotations

from typing import Any

from capabilities.work.context import JobAborted


class RecordingContext:
    """A JobContext for runner tests.

    `abort_after_checkpoints=N` makes the Nth call to `checkpoint()` raise JobAborted,
    as a cancel arriving at that point would.
    """

    def __init__(self, *, job_id: str = "test-job", abort_after_checkpoints: int | None = None):
        self.job_id = job_id
        self.abort_after_checkpoints = abort_after_checkpoints
        self.checkpoints = 0
        self.reports: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}

    def checkpoint(self) -> None:
        self.checkpoints += 1
        if self.abort_after_checkpoints is not None and (
            self.checkpoints >= self.abort_after_checkpoints
        ):
            raise JobAborted

    def report(self, *, progress: float, total: float | None = None, stage: str = "") -> None:
        self.reports.append({"progress": progress, "total": total, "stage": stage})

    def save_file(self, data: bytes, *, mime_type: str, filename: str) -> dict[str, Any]:
        name = f"{self.job_id}-{len(self.files) + 1}"
        self.files[name] = data
        return {"$file": name, "mimeType": mime_type, "size": len(data), "filename": filename}
