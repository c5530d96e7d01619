"""Whose MCP tasks a request sees: its user's, from any of their keys and sessions, or a
service key's own; another's task id is not found (rows only, no stack)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.access.principal import Principal
from capabilities.mcp_door import task_service
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
