"""Job events as log records: one per transition of a job, on the `abp.jobs` logger.

`created`, `dispatched` (handed to Celery), `started`, `settled` (with its outcome) and
`stopped` (the work stopped after its settle: a cancelled job's worker letting go, a hard
kill, a lost worker). Every record carries the job's `jobId`, `callId`, `sessionId`,
`agent` (the principal whose budgets it spends: `key:<prefix>`, or `page:` / `anonymous:`
and the client address), `capability`, `queue` and `door` as fields of its own, which
JSON logs (ABP_LOG_FORMAT=json) put at the top level of each line.

Off unless `abp.jobs` logs at INFO (ABP_LOG_JOB_EVENTS; on by default with JSON logs).
Each record is written where its transition is, from what the writer has in hand: the
conditional UPDATEs (`row_updates.update_if`) return the job's fields in the same
statement (RETURNING) while events are on, and `lifecycle.create_job` has the new row.
The one thing a new row does not know is its session's door: that is read once per
session and process, and remembered (a session's door never changes).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from capabilities.models import AgentSession

LOGGER = logging.getLogger("abp.jobs")

# The job's own columns every event carries, in the order update_if returns them.
CONTEXT_COLUMNS = ("call_id", "session_id", "capability", "principal", "queue")

# Doors of sessions seen by this process; a session's door never changes.
_DOORS_KEPT = 10_000
_doors: dict[str, str] = {}


def enabled() -> bool:
    """Whether job events are logged (checked before gathering anything for them)."""
    return LOGGER.isEnabledFor(logging.INFO)


def emit(
    event: str,
    job_id: uuid.UUID | str,
    *,
    call_id: str,
    session_id: uuid.UUID | str,
    agent: str,
    capability: str,
    queue: str,
    door: str,
    **details: Any,
) -> None:
    """Log one event of one job, its fields as the record's own attributes."""
    fields = {
        "event": event,
        "jobId": str(job_id),
        "callId": call_id,
        "sessionId": str(session_id),
        "agent": agent,
        "capability": capability,
        "queue": queue,
        "door": door,
        **details,
    }
    LOGGER.info("job %s", event, extra=fields)


def emit_row(event: str, job_id: uuid.UUID | str, row: tuple[Any, ...], **details: Any) -> None:
    """Log an event from what an UPDATE returned: CONTEXT_COLUMNS, then the door."""
    call_id, session_id, capability, principal, queue, door = row
    session = str(uuid.UUID(str(session_id)))
    remember_door(session, door or "")
    emit(
        event,
        job_id,
        call_id=call_id,
        session_id=session,
        agent=principal,
        capability=capability,
        queue=queue,
        door=door or "",
        **details,
    )


def remember_door(session_id: str, door: str) -> None:
    """Keep a session's door (bounded: forgotten all at once when full)."""
    if len(_doors) >= _DOORS_KEPT:
        _doors.clear()
    _doors[session_id] = door


def door_of(session_id: uuid.UUID | str) -> str:
    """A session's door: remembered, or read once (only while events are on)."""
    session = str(uuid.UUID(str(session_id)))
    door = _doors.get(session)
    if door is None:
        found = AgentSession.objects.filter(pk=session).values_list("door", flat=True).first()
        door = found or ""
        remember_door(session, door)
    return door
