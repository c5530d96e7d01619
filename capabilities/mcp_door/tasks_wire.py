"""The tasks extension's wire (SEP-2663, `io.modelcontextprotocol/tasks`), from job rows.

Shapes as the extension's schema has them (modelcontextprotocol/ext-tasks,
schema/draft/schema.ts): a flat `Task` (`ttlMs`, `pollIntervalMs`), a
`CreateTaskResult` tagged `resultType: "task"`, and a `tasks/get` result with the
outcome inlined. No I/O: the rows and the tool result come from the caller.

A job that failed is a `completed` task whose result has `isError: true`: the
extension keeps `failed` for JSON-RPC errors, and a plain call answers a failed
job with that tool result. A cancelled job (the client's `tasks/cancel`, an
operator, the deadline) is `cancelled`, its `statusMessage` saying why.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from capabilities.mcp_door import task_rows
from capabilities.models import Job, JobStatus

IDENTIFIER = "io.modelcontextprotocol/tasks"

STATUSES: dict[str, str] = {
    JobStatus.QUEUED: "working",
    JobStatus.RUNNING: "working",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "completed",
    JobStatus.CANCELLED: "cancelled",
}


class TaskParams(types.RequestParams):
    """`tasks/get` and `tasks/cancel`: `{taskId}`."""

    task_id: str


class UpdateTaskParams(TaskParams):
    """`tasks/update`: `{taskId, inputResponses}`."""

    input_responses: dict[str, Any]


def created(job: Job) -> dict[str, Any]:
    """The `CreateTaskResult` a task-augmented `tools/call` answers with."""
    return {"resultType": "task", **_fields(job)}


def detailed(job: Job, result: dict[str, Any] | None) -> dict[str, Any]:
    """The `tasks/get` result: the task, and the tool result once it completed."""
    fields = _fields(job)
    if fields["status"] == "completed":
        assert result is not None
        fields["result"] = result
    return {"resultType": "complete", **fields}


def _fields(job: Job) -> dict[str, Any]:
    task = task_rows.task_of(job)
    fields: dict[str, Any] = {
        "taskId": task.task_id,
        "status": STATUSES[job.status],
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttlMs": task.ttl,
    }
    if task.status_message is not None:
        fields["statusMessage"] = task.status_message
    if task.poll_interval is not None:
        fields["pollIntervalMs"] = task.poll_interval
    return fields
