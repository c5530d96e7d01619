"""A capability's `authorize` check: after its permissions, before anything is stored
(the agent's start, in the database hop that writes the row) and again in the worker.

The permissions alone are in tests/access/test_users.py; the check over the real
stack, in tests/stack/test_enqueue_stack.py and the host project's test.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from capabilities.access import agent_keys, permissions
from capabilities.access.principal import Principal
from capabilities.calls import availability, budgets, job_writes
from capabilities.models import AgentSession, Job
from capabilities.protocol import ErrorCode
from capabilities.work import registry
from capabilities.work.declare import capability
from tests.support.people import person

NAME = "test.checked"
SCHEMA = {"type": "object"}

Check = Callable[[Any, dict[str, Any]], bool]


@pytest.fixture(autouse=True)
def forget_declared() -> Iterator[None]:
    yield
    registry.unregister(NAME)


def declare(check: Check, *, perms: tuple[str, ...] = ()) -> registry.CapabilitySpec:
    @capability(
        NAME, description="Checked.", input_schema=SCHEMA, output_schema=SCHEMA,
        permissions=perms, authorize=check,
    )  # fmt: skip
    def run(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {}

    return registry.require(NAME)


def user(*perms: str, active: bool = True) -> Any:
    return person(*perms, active=active, prefix="p")


# -- the check's answers (no database: no permissions declared) ---------------------------


def test_only_true_lets_the_call_go_on_with_the_user_and_params_it_was_given() -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []

    def check(who: Any, params: dict[str, Any]) -> bool:
        seen.append((who, params))
        return params.get("ok") is True

    spec = declare(check)
    someone = object()
    assert permissions.call_refusal(spec, someone, {"ok": True}) is None  # type: ignore[arg-type]
    assert seen == [(someone, {"ok": True})]
    refused = permissions.call_refusal(spec, None, {"ok": False})
    assert refused is not None
    assert refused.code == ErrorCode.PERMISSION_DENIED
    assert refused.details == {"capability": NAME, "reason": "not allowed"}
    assert f"{NAME} is not allowed" in refused.message
    assert seen[-1] == (None, {"ok": False})  # a call for nobody: the check says


def test_a_truthy_answer_that_is_not_true_refuses() -> None:
    spec = declare(lambda who, params: 1)  # type: ignore[arg-type,return-value]
    assert permissions.call_refusal(spec, None, {}) is not None


def test_permission_denied_gives_its_reason() -> None:
    def check(who: Any, params: dict[str, Any]) -> bool:
        raise PermissionDenied(f"note {params['note_id']} is not yours")

    refused = permissions.call_refusal(declare(check), None, {"note_id": 7})
    assert refused is not None
    assert refused.code == ErrorCode.PERMISSION_DENIED
    assert refused.message == f"{NAME} is not allowed: note 7 is not yours"
    assert refused.details == {"capability": NAME, "reason": "note 7 is not yours"}


def test_a_check_that_crashes_lets_nobody_through_and_tells_no_one_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def check(who: Any, params: dict[str, Any]) -> bool:
        raise KeyError("secret detail")

    with caplog.at_level(logging.ERROR, logger=permissions.__name__):
        refused = permissions.call_refusal(declare(check), None, {})
    assert refused is not None
    assert refused.code == ErrorCode.INTERNAL_ERROR
    assert refused.to_json()["retryable"] is False
    assert "secret" not in refused.message
    assert "secret detail" in caplog.text  # the traceback, in the log


def test_a_check_is_never_skipped_for_want_of_params() -> None:
    spec = declare(lambda who, params: True)
    with pytest.raises(TypeError, match="needs the call's params"):
        permissions.call_refusal(spec, None, None)
    # A listing reads the permissions alone: it has no params to check.
    assert permissions.user_refusal(spec, None) is None


# -- with the user loaded from the database -----------------------------------------------


@pytest.mark.usefixtures("database")
def test_permissions_come_first_and_a_deactivated_user_is_refused_before_the_check() -> None:
    asked: list[Any] = []

    def check(who: Any, params: dict[str, Any]) -> bool:
        asked.append(who)
        return True

    spec = declare(check, perms=("auth.view_user",))
    lacking = permissions.refusal(spec, user().pk, {})
    assert lacking is not None
    assert lacking.details == {"capability": NAME, "missing": ["auth.view_user"]}
    assert not asked
    allowed = user("auth.view_user")
    assert permissions.refusal(spec, allowed.pk, {}) is None
    assert [who.pk for who in asked] == [allowed.pk]
    registry.unregister(NAME)
    spec = declare(check)  # a check alone: a deactivated user is still nobody's to check
    gone = permissions.refusal(spec, user(active=False).pk, {})
    assert gone is not None
    assert "no active user" in gone.message
    assert len(asked) == 1


@pytest.mark.usefixtures("database")
def test_an_agents_call_the_check_refuses_stores_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's check point (calls/job_writes.py): refused before its row."""
    # Seams: no Redis here (every queue has a worker), and the row is not sent on.
    monkeypatch.setattr(availability, "unavailable", lambda capability: None)
    monkeypatch.setattr("capabilities.jobs.dispatch.may_go_now", lambda *args: False)
    monkeypatch.setattr("capabilities.jobs.dispatch.created", lambda job: None)
    spec = declare(lambda who, params: params.get("mine") is True)
    owner = user()
    key, _ = agent_keys.create_key("checked", owner=owner)
    principal = Principal(kind="key", key=key, client_address="", user_id=owner.pk)
    session_id = str(uuid.uuid4())
    session = AgentSession.objects.create(id=session_id)

    def new(call_id: str, params: dict[str, Any]) -> job_writes.NewJob:
        return job_writes.NewJob(
            principal=principal,
            job={"session_id": session_id, "call_id": call_id, "request_id": call_id,
                 "capability": spec.name, "params": params, "timeout_ms": 30_000,
                 "progress_token": None},
        )  # fmt: skip

    refused, stored = job_writes._create_all(
        [new("theirs", {"mine": False}), new("mine", {"mine": True})]
    )
    assert isinstance(refused, budgets.NotPermitted)
    assert refused.error.code == ErrorCode.PERMISSION_DENIED
    assert isinstance(stored, Job)
    assert list(Job.objects.filter(session=session).values_list("call_id", flat=True)) == ["mine"]
