"""What an MCP task is, read from its job row (rows only, no stack): its status, one map
for both wires, and whose tasks a request sees: its user's, from any of their keys and
sessions, or a service key's own; another's task id is not found."""

from __future__ import annotations

import uuid
from typing import Any

import mcp_types as types
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.access.principal import Principal
from capabilities.mcp_door import task_service, tasks, tasks_extension
from capabilities.mcp_door.task_service import TaskStatus
from capabilities.models import AgentSession, Door, Job, JobStatus

pytestmark = pytest.mark.usefixtures("database")


def new_user() -> Any:
    return get_user_model().objects.create_user(username=f"tasks-{uuid.uuid4().hex[:10]}")


def key_principal(owner: Any = None) -> Principal:
    key, _ = agent_keys.create_key("task rows", owner=owner)
    return Principal(kind="key", key=key, client_address="127.0.0.1", user_id=key.owner_id)


def task_of(principal: Principal, *, task: bool = True) -> Job:
    """A job made through `principal` in a session of its own (a task, or a plain call)."""
    session = AgentSession.objects.create(
        door=Door.MCP,
        principal=principal.rate_limit_id,
        user_id=principal.user_id,
        agent_key=principal.key,
    )
    call_id = task_service.new_call_id(1000) if task else str(uuid.uuid4())
    job: Job = Job.objects.create(
        session=session,
        call_id=call_id,
        capability="test.sleep",
        principal=principal.rate_limit_id,
        user_id=principal.user_id,
        status=JobStatus.RUNNING,
        started_at=timezone.now(),
    )
    return job


def ids(jobs: list[Job]) -> list[str]:
    return [str(job.id) for job in jobs]


def test_a_users_tasks_are_theirs_from_any_of_their_keys_and_sessions() -> None:
    ann, bob = new_user(), new_user()
    ann_laptop, ann_ci, bob_key = key_principal(ann), key_principal(ann), key_principal(bob)
    made = [task_of(ann_laptop), task_of(ann_ci)]
    bobs = task_of(bob_key)
    task_of(ann_laptop, task=False)  # a plain call is never a task

    for principal in (ann_laptop, ann_ci):
        assert ids(task_service.page(principal, None).jobs) == ids(made)
        assert [task_service.find(principal, str(job.id)) for job in made] == made
        assert task_service.find(principal, str(bobs.id)) is None
    assert ids(task_service.page(bob_key, None).jobs) == ids([bobs])
    for job in made:
        assert task_service.find(bob_key, str(job.id)) is None
    # Another user's task as a cursor is an unknown cursor, as any id is.
    assert task_service.page(bob_key, str(made[0].id)).unknown_cursor


def test_a_service_keys_tasks_are_its_own_and_no_users() -> None:
    ann = new_user()
    service, other_service, ann_key = key_principal(), key_principal(), key_principal(ann)
    own = task_of(service)
    task_of(other_service)
    anns = task_of(ann_key)
    assert ids(task_service.page(service, None).jobs) == ids([own])
    assert task_service.find(service, str(anns.id)) is None
    assert task_service.find(other_service, str(own.id)) is None
    assert task_service.find(ann_key, str(own.id)) is None


def test_anything_not_a_task_id_is_not_found() -> None:
    principal = key_principal(new_user())
    plain = task_of(principal, task=False)
    for task_id in ("not-a-uuid", str(uuid.uuid4()), str(plain.id)):
        assert task_service.find(principal, task_id) is None


def job_in(status: JobStatus, **fields: Any) -> Job:
    """An unsaved task's job in `status`, granted a ttl of 1000 ms."""
    return Job(
        session_id=uuid.uuid4(),
        call_id=task_service.new_call_id(1000),
        status=status,
        created_at=timezone.now(),
        **fields,
    )


def test_every_job_status_is_one_task_status() -> None:
    assert {status: task_service.task_of(job_in(status)).status for status in JobStatus} == {
        JobStatus.QUEUED: TaskStatus.WORKING,
        JobStatus.RUNNING: TaskStatus.WORKING,
        JobStatus.SUCCEEDED: TaskStatus.COMPLETED,
        JobStatus.FAILED: TaskStatus.FAILED,
        JobStatus.CANCELLED: TaskStatus.CANCELLED,
    }


def test_the_wires_name_the_services_status_and_the_extension_completes_a_failure() -> None:
    for status in JobStatus:
        task = task_service.task_of(job_in(status))
        assert types.Task.model_validate(tasks._fields(task)).status == task.status
        extension = tasks_extension._fields(task)["status"]
        assert extension == ("completed" if status == JobStatus.FAILED else task.status)


def test_a_task_polls_while_it_works_and_says_why_it_ended() -> None:
    running = task_service.task_of(job_in(JobStatus.RUNNING, stage="Rendering"))
    assert (running.ttl_ms, running.poll_interval_ms) == (1000, 1000)
    assert running.status_message == "Rendering"
    failed = job_in(JobStatus.FAILED, error_code="WORK_FAILED", error_message="Bad page")
    ended = task_service.task_of(failed)
    assert (ended.poll_interval_ms, ended.status_message) == (None, "WORK_FAILED: Bad page")
    assert task_service.task_of(job_in(JobStatus.SUCCEEDED)).status_message is None


def test_a_ttl_is_granted_as_asked_up_to_the_job_retention() -> None:
    kept = task_service.granted_ttl(None)
    assert kept > 0
    assert [task_service.granted_ttl(asked) for asked in (-5, 0, 60_000, kept + 1)] == [
        0,
        0,
        60_000,
        kept,
    ]
