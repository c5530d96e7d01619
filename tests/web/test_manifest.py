"""`/abp.json`: what anyone may call, and that signing in shows more; a user's own list."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from capabilities.work import registry

pytestmark = pytest.mark.usefixtures("database")


def names(client: Client) -> tuple[set[str], dict[str, object]]:
    response = client.get("/abp.json")
    document = response.json()
    return {entry["name"] for entry in document["capabilities"]}, document


def test_anyone_sees_what_needs_no_permission_and_that_signing_in_shows_more() -> None:
    shown, document = names(Client(HTTP_HOST="127.0.0.1"))
    guarded = {spec.name for spec in registry.all_specs() if spec.permissions}
    assert guarded
    assert not shown & guarded
    assert shown == {spec.name for spec in registry.all_specs()} - guarded
    assert document["signIn"] == {
        "url": "/accounts/login/",
        "note": "Capabilities that need a user's permission are listed to signed-in users "
        "and to their agents' sessions.",
    }
    response = Client(HTTP_HOST="127.0.0.1").get("/abp.json")
    assert "public" in response["Cache-Control"]
    assert response["Vary"] == "Cookie"


def test_a_signed_in_user_sees_what_their_permissions_allow_and_no_one_else_caches_it() -> None:
    user = get_user_model().objects.create_user(username=f"m-{uuid.uuid4().hex[:8]}")
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="auth", codename="view_user")
    )
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    shown, document = names(client)
    assert "test.guarded" in shown
    assert "signIn" not in document
    assert "private" in client.get("/abp.json")["Cache-Control"]
