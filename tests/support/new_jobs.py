"""A call's row to write in-process (`job_writes.NewJob`), as a door's start makes it."""

from __future__ import annotations

from typing import Any

from capabilities.access import agent_keys
from capabilities.access.principal import Principal
from capabilities.calls import job_writes

LANE = "local@test:1"


def principal(**limits: Any) -> Principal:
    """An agent key's principal (a key of its own, with these limits)."""
    key, _ = agent_keys.create_key("new jobs", **limits)
    return Principal(kind="key", key=key, client_address="127.0.0.1")


def new_job(
    who: Principal, session_id: str, call_id: str, *, run_by: str | None = LANE
) -> job_writes.NewJob:
    """A small call's row, run by the local lane `run_by` (None: through Celery)."""
    return job_writes.NewJob(
        principal=who,
        job={
            "session_id": session_id,
            "call_id": call_id,
            "request_id": f"r-{call_id}",
            "capability": "convert.markdownToHtml",
            "params": {"markdown": "# x"},
            "timeout_ms": 30_000,
            "progress_token": None,
            "run_by": run_by,
        },
    )
