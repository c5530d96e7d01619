"""Revoking an app: its sessions close with its last valid token of the user's."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.test import Client
from oauth2_provider.models import AccessToken

from capabilities.endings import access_withdrawal
from capabilities.oauth import revocation
from tests.access.test_oauth_tokens import issued, person

pytestmark = pytest.mark.usefixtures("database")


def row(token: str) -> Any:
    return AccessToken.objects.get(token_checksum=hashlib.sha256(token.encode()).hexdigest())


@pytest.fixture
def withdrawn(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    found: list[tuple[str, list[Any]]] = []

    def record(reason: str, sessions: Any, **_: Any) -> bool:
        found.append((reason, list(sessions)))
        return True

    monkeypatch.setattr(access_withdrawal, "withdraw", record)
    return found


def test_a_token_names_its_user_and_client() -> None:
    user = person()
    token = issued(user)
    assert revocation.grant_of(token) == (user.pk, row(token).application.client_id)
    assert revocation.grant_of("not-ours") is None


def test_a_user_revoking_an_apps_token_on_their_page_closes_its_sessions(
    withdrawn: list[tuple[str, list[Any]]],
) -> None:
    user = person()
    token = row(issued(user))
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    answer = client.post(f"/o/authorized_tokens/{token.pk}/delete/")
    assert answer.status_code == 302
    assert not AccessToken.objects.filter(pk=token.pk).exists()
    assert [reason for reason, _ in withdrawn] == ["token-revoked"]


def test_an_app_still_holding_a_valid_token_keeps_its_sessions(
    withdrawn: list[tuple[str, list[Any]]],
) -> None:
    user = person()
    token = row(issued(user))
    AccessToken.objects.create(
        user=user,
        application=token.application,
        scope="jobs",
        expires=token.expires,
        resource=token.resource,
        token_checksum="b" * 64,
    )
    assert revocation.withdraw_if_revoked(user.pk, token.application.client_id)
    assert withdrawn == []
