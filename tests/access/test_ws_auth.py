"""Who a WebSocket is: credentials read from the upgrade, checked against keys and tokens."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities.access import agent_keys, page_tokens
from capabilities.access import credentials as ws_auth
from capabilities.conf import abp_settings
from capabilities.endings import key_revocation
from capabilities.models import AgentKey
from capabilities.protocol import closes

pytestmark = pytest.mark.usefixtures("database")

ORIGIN = "http://127.0.0.1:8000"


def scope(
    *,
    headers: dict[str, str] | None = None,
    subprotocols: list[str] | None = None,
    query: str = "",
) -> dict[str, Any]:
    return {
        "type": "websocket",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "subprotocols": subprotocols or [],
        "query_string": query.encode(),
        "client": ("10.0.0.7", 5555),
    }


def test_credentials_are_read_from_header_then_subprotocol_then_query() -> None:
    assert ws_auth.credential_of(scope(headers={"Authorization": "Bearer aaa"})) == "aaa"
    assert ws_auth.credential_of(scope(headers={"Authorization": "bearer  aaa "})) == "aaa"
    assert ws_auth.credential_of(scope(subprotocols=["abp", "abp.bearer.bbb"])) == "bbb"
    assert ws_auth.credential_of(scope(query="x=1&access_token=ccc")) == "ccc"
    both = scope(headers={"Authorization": "Bearer aaa"}, subprotocols=["abp.bearer.bbb"])
    assert ws_auth.credential_of(both) == "aaa"
    assert ws_auth.credential_of(scope(headers={"Authorization": "Basic aaa"})) is None
    assert ws_auth.credential_of(scope()) is None


def test_abp_subprotocol_is_selected_only_when_offered() -> None:
    assert ws_auth.selected_subprotocol(scope(subprotocols=["abp", "abp.bearer.x"])) == "abp"
    assert ws_auth.selected_subprotocol(scope(subprotocols=["abp.bearer.x"])) is None
    assert ws_auth.selected_subprotocol(scope()) is None


def test_a_key_authenticates_and_carries_its_own_limits() -> None:
    key, plaintext = agent_keys.create_key("unit", max_concurrent_calls=3, calls_per_minute=7)
    principal = ws_auth.authenticate(scope(headers={"Authorization": f"Bearer {plaintext}"}))
    assert principal.kind == "key"
    assert principal.key is not None
    assert principal.key.pk == key.pk
    assert (principal.max_concurrent_calls, principal.calls_per_minute) == (3, 7)
    assert principal.rate_limit_id == f"key:{key.prefix}"
    assert AgentKey.objects.get(pk=key.pk).secret_hash != plaintext  # only the hash is kept
    assert plaintext.split("_")[-1] not in AgentKey.objects.get(pk=key.pk).secret_hash


def test_keys_without_limits_use_the_settings() -> None:
    _, plaintext = agent_keys.create_key("defaults")
    principal = ws_auth.authenticate(scope(query=f"access_token={plaintext}"))
    assert principal.max_concurrent_calls == abp_settings().MAX_CONCURRENT_CALLS
    assert principal.calls_per_minute == abp_settings().CALLS_PER_MINUTE


@pytest.mark.parametrize(
    ("credential", "reason"),
    [
        (None, "missing-credentials"),
        ("", "missing-credentials"),
        ("abp_deadbeef_" + "z" * 43, "invalid-credentials"),
        ("page.forged.token.value", "invalid-credentials"),
        ("something-else", "invalid-credentials"),
        ("abp_deadbeef_\x00" + "z" * 42, "invalid-credentials"),
    ],
)
def test_bad_credentials_are_refused_with_their_reason(credential: str | None, reason: str) -> None:
    headers = {"Authorization": f"Bearer {credential}"} if credential is not None else None
    with pytest.raises(ws_auth.Refused) as refused:
        ws_auth.authenticate(scope(headers=headers))
    assert refused.value.reason == reason
    assert reason in closes.CLOSE_CODES
    assert reason in closes.REFUSAL_MESSAGES


def test_anonymous_clients_only_when_the_setting_allows() -> None:
    with override_settings(ABP={**settings.ABP, "ALLOW_ANONYMOUS": True}):
        principal = ws_auth.authenticate(scope())
        assert (principal.kind, principal.key) == ("anonymous", None)
        assert principal.rate_limit_id == "anonymous:10.0.0.7"
        # A credential that is wrong is still refused.
        with pytest.raises(ws_auth.Refused):
            ws_auth.authenticate(scope(headers={"Authorization": "Bearer nope"}))


def test_page_tokens_are_bound_to_their_origin() -> None:
    token = page_tokens.issue(ORIGIN + "/")
    principal = ws_auth.authenticate(
        scope(headers={"Origin": ORIGIN}, subprotocols=["abp", f"abp.bearer.{token}"])
    )
    assert (principal.kind, principal.rate_limit_id) == ("page", "page:10.0.0.7")
    for origin in ("http://127.0.0.1:8001", "null", ""):
        with pytest.raises(ws_auth.Refused):
            ws_auth.authenticate(
                scope(headers={"Origin": origin}, subprotocols=[f"abp.bearer.{token}"])
            )


def test_page_tokens_are_valid_subprotocol_names() -> None:
    token = page_tokens.issue("https://jobs.example.com")
    allowed = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert set(f"abp.bearer.{token}") <= allowed
    _, key = agent_keys.create_key("chars")
    assert set(f"abp.bearer.{key}") <= allowed


def test_revoked_key_is_refused() -> None:
    key, plaintext = agent_keys.create_key("to revoke")
    assert key_revocation.revoke(AgentKey.objects.filter(pk=key.pk)) == 1
    assert key_revocation.revoke(AgentKey.objects.filter(pk=key.pk)) == 0
    with pytest.raises(ws_auth.Refused) as refused:
        ws_auth.authenticate(scope(headers={"Authorization": f"Bearer {plaintext}"}))
    assert refused.value.reason == "key-revoked"
