"""Keys a user owns: scoped only to what the owner may call, and bounded per user."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities.access import owned_keys
from capabilities.access.owned_keys import KeyRefused, Refusal
from capabilities.models import AgentKey
from tests.support.people import person

pytestmark = pytest.mark.usefixtures("database")


def test_a_user_may_scope_a_key_to_what_they_may_call() -> None:
    lacking, allowed = person(), person("auth.view_user")
    assert "test.guarded" not in {spec.name for spec in owned_keys.callable_by(lacking)}
    assert "test.guarded" in {spec.name for spec in owned_keys.callable_by(allowed)}
    key, plaintext = owned_keys.create_own_key(
        allowed, name="mine", scopes=["test.guarded", "test.whoami", "test.guarded"]
    )
    assert (key.owner_id, key.scopes) == (allowed.pk, ["test.guarded", "test.whoami"])
    assert plaintext.startswith(f"abp_{key.prefix}_")


def test_a_scope_beyond_the_owners_rights_is_refused_with_its_code() -> None:
    user = person()
    with pytest.raises(KeyRefused) as refused:
        owned_keys.create_own_key(user, name="wider", scopes=["test.whoami", "test.guarded"])
    assert refused.value.code is Refusal.SCOPE_NOT_ALLOWED
    assert refused.value.message == (
        "You may not call test.guarded, so no key of yours may be scoped to it."
    )
    assert not AgentKey.objects.filter(owner=user).exists()


def test_the_bound_counts_keys_not_revoked() -> None:
    user = person()
    with override_settings(ABP={**settings.ABP, "MAX_KEYS_PER_USER": 1}):
        first, _ = owned_keys.create_own_key(user, name="first")
        with pytest.raises(KeyRefused) as refused:
            owned_keys.create_own_key(user, name="second")
        assert refused.value.code is Refusal.TOO_MANY_KEYS
        assert list(owned_keys.keys_of(user)) == [first]
        AgentKey.objects.filter(pk=first.pk).update(revoked_at=first.created_at)
        second, _ = owned_keys.create_own_key(user, name="second")
    assert list(owned_keys.keys_of(user)) == [second, first]
    # Another user's keys are not theirs to count.
    assert list(owned_keys.keys_of(person())) == []
