"""A Django user behind a call: an agent key's owner, or the signed-in user of a page;
the key's scopes; the capability's permissions, checked with `has_perm` before a row."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from capabilities.access import agent_keys, page_tokens, permissions
from capabilities.access import credentials as ws_auth
from capabilities.access.principal import Principal
from capabilities.calls import budgets
from capabilities.models import AgentKey
from capabilities.protocol import ErrorCode
from capabilities.work import registry
from capabilities.work.declare import capability

pytestmark = pytest.mark.usefixtures("database")

ORIGIN = "http://127.0.0.1:8000"


def user(*, perms: tuple[str, ...] = (), active: bool = True) -> Any:
    made = get_user_model().objects.create_user(
        username=f"u-{uuid.uuid4().hex[:10]}", password="x", is_active=active
    )
    for name in perms:
        label, codename = name.split(".")
        made.user_permissions.add(
            Permission.objects.get(content_type__app_label=label, codename=codename)
        )
    return made


def connect(credential: str, origin: str = "") -> Principal:
    headers = [(b"authorization", f"Bearer {credential}".encode())]
    if origin:
        headers.append((b"origin", origin.encode()))
    return ws_auth.authenticate({"headers": headers, "client": ("10.0.0.9", 1)})


def test_a_key_acts_for_its_owner_and_a_users_keys_share_one_budget() -> None:
    owner = user()
    _, first = agent_keys.create_key("first", owner=owner)
    _, second = agent_keys.create_key("second", owner=owner)
    _, service = agent_keys.create_key("service")
    one, two, nobody = connect(first), connect(second), connect(service)
    assert one.user_id == two.user_id == owner.pk
    assert one.rate_limit_id == two.rate_limit_id == f"user:{owner.pk}"
    assert nobody.user_id is None
    assert nobody.rate_limit_id.startswith("key:")


def test_a_page_served_to_a_signed_in_user_runs_for_that_user() -> None:
    owner = user()
    signed_in = connect(page_tokens.issue(ORIGIN, user_id=owner.pk), ORIGIN)
    anonymous = connect(page_tokens.issue(ORIGIN), ORIGIN)
    assert (signed_in.kind, signed_in.user_id) == ("page", owner.pk)
    assert (anonymous.kind, anonymous.user_id) == ("page", None)


def test_a_keys_scopes_narrow_what_it_may_call_before_anything_else() -> None:
    key, _ = agent_keys.create_key("scoped", owner=user(), scopes=["test.whoami"])
    principal = Principal(kind="key", key=key, client_address="", user_id=key.owner_id)
    assert principal.may_call("test.whoami")
    assert not principal.may_call("test.guarded")
    refused = budgets.call_refusal(principal, "test.guarded", {})
    assert refused is not None
    assert refused.code == ErrorCode.PERMISSION_DENIED
    assert refused.details == {"capability": "test.guarded", "scopes": ["test.whoami"]}


def test_permissions_are_djangos_has_perm_and_the_refusal_names_what_is_missing() -> None:
    guarded = registry.require("test.guarded")
    assert guarded.permissions == ("auth.view_user",)
    assert permissions.refusal(guarded, user(perms=("auth.view_user",)).pk) is None
    lacking = permissions.refusal(guarded, user().pk)
    assert lacking is not None
    assert lacking.code == ErrorCode.PERMISSION_DENIED
    assert lacking.details == {"capability": "test.guarded", "missing": ["auth.view_user"]}
    for nobody in (None, user(perms=("auth.view_user",), active=False).pk):
        refused = permissions.refusal(guarded, nobody)
        assert refused is not None
        assert "no active user" in refused.message
    # A capability without permissions reads nothing.
    assert permissions.refusal(registry.require("test.whoami"), None) is None


def test_permissions_must_be_written_as_has_perm_takes_them() -> None:
    def function(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {}

    schema = {"type": "object"}
    for wrong in ("auth.view_user", ["view_user"]):
        with pytest.raises(TypeError, match="permission"):
            capability(
                "test.never", description="x", input_schema=schema, output_schema=schema,
                permissions=wrong,
            )(function)  # fmt: skip
    assert registry.get("test.never") is None


def test_create_agent_key_gives_a_key_an_owner_and_scopes() -> None:
    owner = user()
    name = f"cli-{uuid.uuid4().hex[:8]}"
    call_command(
        "create_agent_key", name, "--user", owner.get_username(), "--scope", "test.whoami",
        "--quiet",
    )  # fmt: skip
    key = AgentKey.objects.get(name=name)
    assert (key.owner_id, key.scopes) == (owner.pk, ["test.whoami"])
    with pytest.raises(CommandError, match="No user 'nobody-here'"):
        call_command("create_agent_key", "x", "--user", "nobody-here")
    with pytest.raises(CommandError, match=r"No capability 'no\.such'"):
        call_command("create_agent_key", "x", "--scope", "no.such")


def test_the_worker_loads_ctx_user_and_checks_again_before_running() -> None:
    """A job may wait: its user may lose a permission, or be deactivated, meanwhile."""
    from types import SimpleNamespace

    from capabilities.models import Job
    from capabilities.worker.executor import _for_whom

    allowed = user(perms=("auth.view_user",))
    context: Any = SimpleNamespace(user=None)
    assert _for_whom(Job(capability="test.guarded", user_id=allowed.pk), context) is None
    assert context.user.pk == allowed.pk
    allowed.user_permissions.clear()
    allowed = get_user_model().objects.get(pk=allowed.pk)  # has_perm caches per instance
    lost = _for_whom(Job(capability="test.guarded", user_id=allowed.pk), context)
    assert lost is not None
    assert lost.error is not None
    assert lost.error.details == {"capability": "test.guarded", "missing": ["auth.view_user"]}
    gone = user()
    gone.is_active = False
    gone.save()
    deactivated = _for_whom(Job(capability="test.whoami", user_id=gone.pk), context)
    assert deactivated is not None
    assert deactivated.error is not None
    assert deactivated.error.code == ErrorCode.PERMISSION_DENIED
    # A job for nobody runs as it always did, with ctx.user None.
    nobody: Any = SimpleNamespace(user=None)
    assert _for_whom(Job(capability="test.whoami"), nobody) is None
    assert nobody.user is None


def test_run_capability_takes_the_user_and_their_permissions() -> None:
    from capabilities.testing import run_capability
    from capabilities.work.context import CapabilityError

    allowed = user(perms=("auth.view_user",))
    assert run_capability("test.guarded", {}, user=allowed).result == {
        "user": allowed.get_username()
    }
    assert run_capability("test.whoami", {}).result == {"user": None}
    with pytest.raises(CapabilityError, match=r"needs the permission auth\.view_user"):
        run_capability("test.guarded", {}, user=user())


def test_a_principal_is_shown_only_what_it_may_call() -> None:
    from capabilities.access import visibility

    def shown(principal: Principal) -> set[str]:
        return set(visibility.names_for(principal)) & {"test.whoami", "test.guarded"}

    allowed, lacking = user(perms=("auth.view_user",)), user()
    service, _ = agent_keys.create_key("service")
    scoped, _ = agent_keys.create_key("scoped", owner=allowed, scopes=["test.whoami"])
    mine, _ = agent_keys.create_key("mine", owner=allowed)
    theirs, _ = agent_keys.create_key("theirs", owner=lacking)
    for key, expected in (
        (mine, {"test.whoami", "test.guarded"}),
        (theirs, {"test.whoami"}),
        (service, {"test.whoami"}),
        (scoped, {"test.whoami"}),
    ):
        principal = Principal(kind="key", key=key, client_address="", user_id=key.owner_id)
        assert shown(principal) == expected, key.name
