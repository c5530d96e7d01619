"""OAuth access tokens as credentials: the toolkit's checks, and our audience rule."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, set_token_value

from capabilities.access import credentials, oauth_tokens

pytestmark = pytest.mark.usefixtures("database")

MCP = "http://127.0.0.1/mcp"


def person(*, active: bool = True) -> Any:
    return get_user_model().objects.create_user(
        username=f"o-{uuid.uuid4().hex[:10]}", is_active=active
    )


def issued(
    user: Any,
    *,
    resource: list[str] | None = None,
    scope: str = "jobs",
    expires_in: timedelta = timedelta(hours=1),
) -> str:
    """A token as the toolkit issues it (hashed at rest); its plain value."""
    application = Application.objects.create(
        name="agent app",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://127.0.0.1/callback",
    )
    value = secrets.token_urlsafe(30)
    token = AccessToken(
        user=user,
        application=application,
        scope=scope,
        expires=timezone.now() + expires_in,
        resource=[MCP] if resource is None else resource,
    )
    set_token_value(token, value)
    token.save()
    return value


def scope_with(token: str, *, path: str = "/mcp", query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "scheme": "http",
        "path": path,
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 50000),
        "query_string": query,
    }


def test_a_token_issued_for_mcp_acts_for_its_user_through_its_client() -> None:
    user = person()
    grant = oauth_tokens.verify(issued(user), MCP)
    assert grant.user_id == user.pk
    assert grant.scopes == ("jobs",)
    assert grant.client_id


def test_the_principal_of_a_token_spends_its_users_budget() -> None:
    user = person()
    principal = credentials.authenticate(scope_with(issued(user)))
    assert principal.kind == "token"
    assert principal.user_id == user.pk
    assert principal.rate_limit_id == f"user:{user.pk}"
    assert principal.client == principal.oauth_client != ""


def test_a_token_issued_for_no_resource_is_refused() -> None:
    # django-oauth-toolkit lets these through by default; MCP says MUST NOT.
    with pytest.raises(oauth_tokens.TokenRefused) as refused:
        oauth_tokens.verify(issued(person(), resource=[]), MCP)
    assert refused.value.reason == "wrong-audience"


def test_a_token_issued_for_another_server_is_refused() -> None:
    token = issued(person(), resource=["https://other.example/mcp"])
    with pytest.raises(oauth_tokens.TokenRefused) as refused:
        oauth_tokens.verify(token, MCP)
    assert refused.value.reason == "wrong-audience"


def test_a_token_for_mcp_is_not_accepted_at_another_door() -> None:
    with pytest.raises(credentials.Refused) as refused:
        credentials.authenticate(scope_with(issued(person()), path="/abp/ws"))
    assert refused.value.reason == "wrong-audience"


def test_a_token_for_the_whole_site_is_accepted_at_every_door() -> None:
    token = issued(person(), resource=["http://127.0.0.1/"])
    for path in ("/mcp", "/abp/ws", "/abp/rpc"):
        assert credentials.authenticate(scope_with(token, path=path)).kind == "token"
    # A WebSocket's scope as Daphne gives it: `ws`, or no scheme at all.
    for scheme in ("ws", None):
        websocket = {**scope_with(token, path="/abp/ws"), "type": "websocket", "scheme": scheme}
        assert credentials.authenticate(websocket).kind == "token"


@pytest.mark.parametrize("token", ["", "not-a-token", "x" * 40])
def test_an_unknown_token_is_invalid(token: str) -> None:
    with pytest.raises(oauth_tokens.TokenRefused) as refused:
        oauth_tokens.verify(token, MCP)
    assert refused.value.reason == "invalid-credentials"


def test_an_expired_token_is_invalid() -> None:
    token = issued(person(), expires_in=timedelta(seconds=-1))
    with pytest.raises(oauth_tokens.TokenRefused):
        oauth_tokens.verify(token, MCP)


def test_a_revoked_token_is_invalid() -> None:
    token = issued(person())
    AccessToken.objects.get(token_checksum=hashlib.sha256(token.encode()).hexdigest()).revoke()
    with pytest.raises(oauth_tokens.TokenRefused):
        oauth_tokens.verify(token, MCP)


def test_a_deactivated_users_token_is_refused_as_such() -> None:
    user = person()
    token = issued(user)
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    with pytest.raises(oauth_tokens.TokenRefused) as refused:
        oauth_tokens.verify(token, MCP)
    assert refused.value.reason == "user-inactive"


@pytest.mark.parametrize(
    "presented", ["abp-page-not-a-token", "abp.anything", "has spaces in it", "x" * 9000]
)
def test_what_cannot_be_an_access_token_is_refused_without_a_lookup(presented: str) -> None:
    assert not credentials._looked_up(presented)
    with pytest.raises(credentials.Refused) as refused:
        credentials.authenticate(scope_with(presented))
    assert refused.value.reason == "invalid-credentials"


def test_a_deactivated_owners_key_and_page_are_refused_as_such() -> None:
    from capabilities.access import agent_keys, page_tokens

    user = person()
    _, key = agent_keys.create_key("owned", owner=user)
    page = page_tokens.issue("http://127.0.0.1", user_id=user.pk)
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    for presented in (key, page):
        scope = scope_with(presented, path="/abp/ws")
        scope["headers"].append((b"origin", b"http://127.0.0.1"))
        assert credentials._looked_up(presented)
        with pytest.raises(credentials.Refused) as refused:
            credentials.authenticate(scope)
        assert refused.value.reason == "user-inactive"


def test_a_token_without_the_jobs_scope_is_refused_for_its_scope() -> None:
    with pytest.raises(credentials.Refused) as refused:
        credentials.authenticate(scope_with(issued(person(), scope="read")))
    assert refused.value.reason == "insufficient-scope"


def test_a_token_in_the_query_string_is_not_read_where_the_url_does_not_count() -> None:
    token = issued(person())
    scope = scope_with("", query=f"access_token={token}".encode())
    scope["headers"] = [(b"host", b"127.0.0.1")]
    assert credentials.credential_of(scope, query=False) is None
    assert credentials.query_credential(scope) == token
