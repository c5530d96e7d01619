"""Deactivating a user: when the signals act, and what they withdraw (no stack).

The cancel pipeline's settle is real (the database); past it, the seams that reach
Redis, the broker and the channel layer record what they were given.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.endings import user_deactivation
from capabilities.jobs import abort_flags, notes, queue
from capabilities.models import (
    AgentSession,
    CancelSource,
    Door,
    Job,
    JobStatus,
    session_group,
)

pytestmark = pytest.mark.usefixtures("database")


@pytest.mark.parametrize(
    ("was_active", "is_active", "due"),
    [
        (True, False, True),  # deactivated
        (False, False, False),  # saved again, inactive: withdrawn already
        (None, False, False),  # created inactive: nothing acts for them yet
        (False, True, False),  # reactivated
        (True, True, False),
        (None, True, False),
    ],
)
def test_only_turning_active_to_inactive_withdraws(
    was_active: bool | None, is_active: bool, due: bool
) -> None:
    assert user_deactivation.withdrawal_due(was_active=was_active, is_active=is_active) is due


@pytest.mark.parametrize(
    ("update_fields", "may_change"),
    [(None, True), (["is_active"], True), (["last_login"], False), ([], False)],
)
def test_a_save_that_cannot_change_is_active_is_not_looked_at(
    update_fields: list[str] | None, may_change: bool
) -> None:
    assert user_deactivation.saves_is_active(update_fields) is may_change


@dataclass
class Told:
    """What went past the database: groups told (and why), flags raised, tasks revoked."""

    groups: list[tuple[str, str]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def reasons(self, group: str) -> list[str]:
        return [reason for told, reason in self.groups if told == group]


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> Told:
    found = Told()

    def notify_group(group: str, note: notes.Note) -> bool:
        found.groups.append((group, str(note.get("reason", note["type"]))))
        return True

    monkeypatch.setattr(notes, "notify_group", notify_group)
    monkeypatch.setattr(notes, "notify", lambda session_id, note: True)
    monkeypatch.setattr(abort_flags, "raise_flag", found.flags.append)
    monkeypatch.setattr(queue, "revoke", lambda job_id, kill=False: None)
    return found


def new_user() -> Any:
    return get_user_model().objects.create_user(username=f"off-{uuid.uuid4().hex[:10]}")


def session_of(user: Any, **fields: Any) -> AgentSession:
    """An open session acting for `user` (a page's: its principal names no user)."""
    values: dict[str, Any] = {"agent_name": "deactivation", "user": user, "auth": "page"}
    values.update(principal=f"page:{uuid.uuid4().hex[:6]}", door=Door.ABP)
    values.update(fields)
    session: AgentSession = AgentSession.objects.create(**values)
    return session


def running_in(session: AgentSession, user: Any) -> Job:
    job: Job = Job.objects.create(
        session=session,
        call_id=f"c-{uuid.uuid4().hex[:8]}",
        capability="test.sleep",
        user=user,
        principal=session.principal,
        status=JobStatus.RUNNING,
        started_at=timezone.now(),
    )
    return job


def status_of(job: Job) -> tuple[str, str, str]:
    job.refresh_from_db()
    return job.status, job.cancel_source, job.error_message


def deactivate(user: Any) -> None:
    user.is_active = False
    user.save()


def test_deactivating_a_user_cancels_their_calls_and_tells_their_connections(
    told: Told,
) -> None:
    user, bystander = new_user(), new_user()
    key, _ = agent_keys.create_key("deactivation", owner=user)
    held = session_of(user)
    dropped = session_of(user, detached_at=timezone.now())
    over = session_of(user, closed_at=timezone.now())
    per_call = session_of(user, door=Door.MCP, per_call=True)
    calls = [running_in(held, user), running_in(dropped, user), running_in(per_call, user)]
    other = running_in(session_of(bystander), bystander)

    deactivate(user)

    for job in calls:
        status, source, _ = status_of(job)
        assert (status, source) == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    assert status_of(other)[0] == JobStatus.RUNNING
    assert sorted(told.flags) == sorted(str(job.id) for job in calls)
    # The held session's connection and the key's are told why; nobody holds the
    # dropped one: it is ended, and can be resumed no more.
    assert told.reasons(session_group(held.pk)) == ["user-inactive"]
    assert told.reasons(agent_keys.key_group(key.prefix)) == ["user-inactive"]
    assert {group for group, _ in told.groups} == {
        session_group(held.pk),
        agent_keys.key_group(key.prefix),
    }
    dropped.refresh_from_db()
    assert (dropped.close_reason, dropped.closed_at is not None) == ("user deactivated", True)
    over.refresh_from_db()
    assert over.close_reason == ""


def test_it_acts_once_the_deactivation_is_committed(told: Told) -> None:
    user = new_user()
    job = running_in(session_of(user), user)
    with transaction.atomic():
        deactivate(user)
        assert status_of(job)[0] == JobStatus.RUNNING
        assert told.groups == []
    assert status_of(job)[0] == JobStatus.CANCELLED


def test_a_deactivation_rolled_back_withdraws_nothing(told: Told) -> None:
    user = new_user()
    job = running_in(session_of(user), user)

    def rolled_back() -> None:
        with transaction.atomic():
            deactivate(user)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        rolled_back()
    assert status_of(job)[0] == JobStatus.RUNNING
    assert told.groups == []


def test_saves_that_deactivate_nobody_withdraw_nothing(told: Told) -> None:
    user = new_user()
    job = running_in(session_of(user), user)
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])
    user.first_name = "Renamed"
    user.save()
    get_user_model().objects.create_user(username=f"new-{uuid.uuid4().hex[:8]}", is_active=False)
    assert status_of(job)[0] == JobStatus.RUNNING
    assert told.groups == []


def test_deactivating_with_update_fields_withdraws(told: Told) -> None:
    user = new_user()
    job = running_in(session_of(user), user)
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert status_of(job)[:2] == (JobStatus.CANCELLED, CancelSource.OPERATOR)


def test_deleting_a_user_withdraws_what_acted_for_them(told: Told) -> None:
    user = new_user()
    key, _ = agent_keys.create_key("deleted", owner=user)
    page = session_of(user)
    keyed = session_of(user, principal=f"user:{user.pk}", auth="key", agent_key=key)
    calls = [running_in(page, user), running_in(keyed, user)]
    user.delete()
    for job in calls:
        assert status_of(job)[:2] == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    assert told.reasons(session_group(page.pk)) == ["user-inactive"]
    assert told.reasons(session_group(keyed.pk)) == ["user-inactive"]
    assert told.reasons(agent_keys.key_group(key.prefix)) == ["user-inactive"]


def test_the_sweep_finishes_a_deactivation_that_sent_no_signal(told: Told) -> None:
    user, active = new_user(), new_user()
    held, mine = session_of(user), session_of(active)
    job, untouched = running_in(held, user), running_in(mine, active)
    service = session_of(None, principal="key:abcd1234", auth="key")
    service_job = running_in(service, None)
    # QuerySet.update sends no signal: only the sweep sees it (a stack's reaper, if one
    # runs on this database, may sweep first: the outcome is the same).
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert told.groups == []

    user_deactivation.finish_deactivations()
    assert status_of(job)[:2] == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    assert told.reasons(session_group(held.pk)) == ["user-inactive"]
    assert status_of(untouched)[0] == JobStatus.RUNNING
    assert status_of(service_job)[0] == JobStatus.RUNNING
    told_groups = {group for group, _ in told.groups}
    assert session_group(mine.pk) not in told_groups
    assert session_group(service.pk) not in told_groups


def test_the_sweep_finds_a_deleted_users_keys_sessions_by_their_principal(told: Told) -> None:
    gone = new_user()
    gone_id = gone.pk
    gone.delete()
    # What a delete whose withdrawal failed leaves: the row's user nulled, its principal.
    session = session_of(None, principal=f"user:{gone_id}", auth="key")
    job = running_in(session, None)
    user_deactivation.finish_deactivations()
    assert status_of(job)[:2] == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    assert told.reasons(session_group(session.pk)) == ["user-inactive"]


def test_the_bound_follows_the_reapers_interval() -> None:
    with override_settings(ABP={**settings.ABP, "REAPER_INTERVAL_SECONDS": 3.0}):
        assert user_deactivation.closed_within() == 2 * 3.0 + user_deactivation.SLACK_SECONDS
