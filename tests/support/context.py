"""The in-memory JobContext of runner tests: `capabilities.testing`'s, with its old names."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from capabilities.testing import RecordingContext as PublicRecordingContext


class RecordingContext(PublicRecordingContext):
    """`capabilities.testing.RecordingContext`, with reports as dicts.

    `abort_after_checkpoints=N` makes the Nth call to `checkpoint()` raise JobAborted,
    as a cancel arriving at that point would.
    """

    def __init__(self, *, job_id: str = "test-job", abort_after_checkpoints: int | None = None):
        super().__init__(job_id=job_id, cancel_at_checkpoint=abort_after_checkpoints)

    @property
    def reports(self) -> list[dict[str, Any]]:
        """Each report as `{"progress", "total", "stage"}`."""
        return [asdict(report) for report in self.progress]
