"""`/abp/keys/`, "Your keys": a signed-in user makes, lists and revokes their own keys."""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from capabilities.access import agent_keys
from capabilities.models import AgentKey
from tests.support.people import person

pytestmark = pytest.mark.usefixtures("database")

KEY = re.compile(r"abp_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")
PAGE = "/abp/keys/"


def signed_in(user: Any, *, enforce_csrf_checks: bool = False) -> Client:
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


def make(client: Client, name: str, *scopes: str) -> str:
    reach = {"reach": "chosen", "scopes": list(scopes)} if scopes else {"reach": "all"}
    return client.post(PAGE, {"name": name, **reach}).content.decode()


def revoke_url(key: AgentKey) -> str:
    return reverse("abp-revoke-key", args=[key.pk])


def test_the_page_and_revoking_need_a_signed_in_user() -> None:
    key, _ = agent_keys.create_key("someone's", owner=person())
    anonymous = Client(HTTP_HOST="127.0.0.1")
    assert reverse("abp-your-keys") == PAGE
    for response in (anonymous.get(PAGE), anonymous.post(revoke_url(key))):
        assert response.status_code == 302
        assert response["Location"] == f"/accounts/login/?next={response.request['PATH_INFO']}"
    assert not AgentKey.objects.get(pk=key.pk).is_revoked


def test_a_new_key_is_shown_once_stored_hashed_and_works() -> None:
    user = person()
    client = signed_in(user)
    response = client.post(PAGE, {"name": "laptop agent", "reach": "all"})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    shown = set(KEY.findall(response.content.decode()))
    assert len(shown) == 1
    plaintext = shown.pop()
    key = AgentKey.objects.get(owner=user)
    assert (key.name, key.scopes, key.is_revoked) == ("laptop agent", [], False)
    secret = plaintext.split("_", 2)[2]
    assert key.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert plaintext.startswith(f"abp_{key.prefix}_")
    found = agent_keys.find_key(plaintext)
    assert found is not None
    assert found.pk == key.pk
    # Never again: not on the page, not in the session.
    page = client.get(PAGE).content.decode()
    assert plaintext not in page
    assert secret not in page
    assert f"abp_{key.prefix}_" in page
    assert secret not in repr(dict(client.session.items()))


def test_the_list_shows_ones_own_keys_and_no_one_elses() -> None:
    user, other = person(), person()
    agent_keys.create_key("mine, scoped", owner=user, scopes=["test.whoami"])
    revoked, _ = agent_keys.create_key("mine, revoked", owner=user)
    AgentKey.objects.filter(pk=revoked.pk).update(revoked_at=revoked.created_at)
    theirs, _ = agent_keys.create_key("theirs", owner=other)
    service, _ = agent_keys.create_key("a service key")
    page = signed_in(user).get(PAGE).content.decode()
    assert "mine, scoped" in page
    assert "<code>test.whoami</code>" in page
    assert "mine, revoked" in page
    assert page.count('class="revoked"') == 1
    for hidden in (theirs, service):
        assert hidden.name not in page
        assert hidden.prefix not in page


def test_scopes_are_offered_from_what_the_user_may_call() -> None:
    lacking = signed_in(person()).get(PAGE).content.decode()
    assert 'value="test.whoami"' in lacking
    assert 'value="test.guarded"' not in lacking
    allowed = signed_in(person("auth.view_user")).get(PAGE).content.decode()
    assert 'value="test.guarded"' in allowed


def test_a_key_is_scoped_to_what_its_owner_may_call() -> None:
    user = person("auth.view_user")
    page = make(signed_in(user), "narrow", "test.guarded", "test.whoami")
    assert len(KEY.findall(page)) == 1
    assert AgentKey.objects.get(owner=user).scopes == ["test.guarded", "test.whoami"]


@pytest.mark.parametrize("scope", ["test.guarded", "no.such.capability"])
def test_a_scope_the_user_may_not_call_is_refused_and_nothing_stored(scope: str) -> None:
    user = person()
    client = signed_in(user)
    response = client.post(PAGE, {"name": "wider", "reach": "chosen", "scopes": [scope]})
    assert response.status_code == 200
    page = response.content.decode()
    assert f"You may not call {scope}, so no key of yours may be scoped to it." in page
    assert not KEY.search(page)
    assert not AgentKey.objects.filter(owner=user).exists()


def test_chosen_with_nothing_chosen_is_refused() -> None:
    user = person()
    response = signed_in(user).post(PAGE, {"name": "nothing", "reach": "chosen"})
    assert "Choose at least one capability, or every one." in response.content.decode()
    assert not AgentKey.objects.filter(owner=user).exists()


def test_the_bound_on_keys_is_checked_before_anything_is_stored() -> None:
    user = person()
    client = signed_in(user)
    with override_settings(ABP={**settings.ABP, "MAX_KEYS_PER_USER": 2}):
        assert KEY.search(make(client, "one"))
        assert KEY.search(make(client, "two"))
        refused = make(client, "three")
        assert "You hold 2 keys, the most one user may" in refused
        assert not KEY.search(refused)
        assert AgentKey.objects.filter(owner=user).count() == 2
        # Revoked keys are not held: revoking one makes room.
        client.post(revoke_url(AgentKey.objects.get(owner=user, name="one")))
        assert KEY.search(make(client, "three"))


def test_revoking_ones_own_key() -> None:
    user = person()
    client = signed_in(user)
    key, _ = agent_keys.create_key("to revoke", owner=user)
    response = client.post(revoke_url(key), follow=True)
    assert response.redirect_chain == [(PAGE, 302)]
    assert "Revoked to revoke: its connections were closed" in response.content.decode()
    assert AgentKey.objects.get(pk=key.pk).is_revoked
    again = client.post(revoke_url(key), follow=True).content.decode()
    assert "to revoke was revoked already." in again


def test_another_users_key_is_404_and_stays() -> None:
    theirs, _ = agent_keys.create_key("theirs", owner=person())
    service, _ = agent_keys.create_key("a service key")
    client = signed_in(person())
    for key in (theirs, service):
        assert client.post(revoke_url(key)).status_code == 404
        assert not AgentKey.objects.get(pk=key.pk).is_revoked
    missing = reverse("abp-revoke-key", args=[uuid.uuid4()])
    assert client.post(missing).status_code == 404


def test_revoking_is_a_post() -> None:
    user = person()
    key, _ = agent_keys.create_key("by GET", owner=user)
    assert signed_in(user).get(revoke_url(key)).status_code == 405
    assert not AgentKey.objects.get(pk=key.pk).is_revoked


def test_making_and_revoking_need_the_csrf_token() -> None:
    user = person()
    key, _ = agent_keys.create_key("kept", owner=user)
    client = signed_in(user, enforce_csrf_checks=True)
    assert client.post(PAGE, {"name": "forged", "reach": "all"}).status_code == 403
    assert client.post(revoke_url(key)).status_code == 403
    assert not AgentKey.objects.get(pk=key.pk).is_revoked
    assert list(AgentKey.objects.filter(owner=user)) == [key]
    # With the page's token, both work.
    client.get(PAGE)
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    made = client.post(PAGE, {"name": "real", "reach": "all", "csrfmiddlewaretoken": token})
    assert KEY.search(made.content.decode())
    assert client.post(revoke_url(key), {"csrfmiddlewaretoken": token}).status_code == 302
    assert AgentKey.objects.get(pk=key.pk).is_revoked
