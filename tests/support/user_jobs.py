"""Users and their jobs as rows, for the tests of "Your jobs" (no stack needed)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from capabilities.jobs import abort_flags, notes, queue
from capabilities.models import ACTIVE_STATUSES, AgentSession, Door, Job, JobStatus


def new_user(*, active: bool = True) -> Any:
    """A fresh user with the password "x"."""
    return get_user_model().objects.create_user(
        username=f"jobs-{uuid.uuid4().hex[:10]}", password="x", is_active=active
    )


def job_for(
    user: Any,
    *,
    status: JobStatus = JobStatus.RUNNING,
    door: Door = Door.ABP,
    capability: str = "test.sleep",
    created_at: datetime | None = None,
    **fields: Any,
) -> Job:
    """A job row of `user` (None: nobody's), in a session of its own on `door`."""
    session = AgentSession.objects.create(agent_name="jobs-test", door=door)
    now = timezone.now()
    settled = status not in ACTIVE_STATUSES
    values: dict[str, Any] = {
        "session": session,
        "call_id": f"c-{uuid.uuid4().hex[:8]}",
        "capability": capability,
        "params": {"steps": 500},
        "user": user,
        "client": "abcd1234",
        "status": status,
        "created_at": created_at or now,
        "started_at": None if status == JobStatus.QUEUED else now,
        "settled_at": now if settled else None,
        "stopped_at": now if settled else None,
        **fields,
    }
    job: Job = Job.objects.create(**values)
    return job


@dataclass
class Stops:
    """What the cancel pipeline did past the database: flags, revokes, sessions told."""

    flags: list[str] = field(default_factory=list)
    revokes: list[str] = field(default_factory=list)
    told: list[str] = field(default_factory=list)


def record_stops(monkeypatch: pytest.MonkeyPatch) -> Stops:
    """Fake the cancel pipeline's seams past the database (Redis, the broker, the
    channel layer) with recorders: its settle, in the database, stays real."""
    stops = Stops()

    def notify(session_id: str, note: notes.Note) -> bool:
        stops.told.append(str(session_id))
        return True

    monkeypatch.setattr(abort_flags, "raise_flag", stops.flags.append)
    monkeypatch.setattr(queue, "revoke", lambda job_id, kill=False: stops.revokes.append(job_id))
    monkeypatch.setattr(notes, "notify", notify)
    return stops
