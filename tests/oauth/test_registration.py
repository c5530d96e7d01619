"""Open Dynamic Client Registration: the real agent apps' payloads, and the bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from capabilities.oauth import registration

pytestmark = pytest.mark.usefixtures("database")

# The redirect URIs the agent apps register, as they publish them.
REAL_CLIENTS = {
    "claude": ["https://claude.ai/api/mcp/auth_callback"],
    "claude-code": ["http://localhost/callback", "http://127.0.0.1/callback"],
    "inspector": ["http://127.0.0.1:6276/oauth/callback", "http://localhost:6274/oauth/callback"],
    "vscode": [
        "https://vscode.dev/redirect",
        "https://insiders.vscode.dev/redirect",
        "http://127.0.0.1/",
        "http://127.0.0.1:33418/",
    ],
    "cursor": [
        "cursor://anysphere.cursor-mcp/oauth/callback",
        "https://www.cursor.com/agents/mcp/oauth/callback",
        "http://localhost:8787/callback",
    ],
    "chatgpt": ["https://chatgpt.com/connector_platform_oauth_redirect"],
}


def register(metadata: dict[str, Any], address: str = "127.0.0.9") -> Any:
    return Client(HTTP_HOST="127.0.0.1", REMOTE_ADDR=address).post(
        "/o/register", data=json.dumps(metadata), content_type="application/json"
    )


def public_client(name: str, uris: list[str]) -> dict[str, Any]:
    return {
        "client_name": name,
        "redirect_uris": uris,
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


@pytest.mark.parametrize("name", sorted(REAL_CLIENTS))
def test_the_agent_apps_register_without_signing_in(name: str) -> None:
    response = register(public_client(name, REAL_CLIENTS[name]), address=f"10.0.0.{len(name)}")
    assert response.status_code == 201, response.content
    assert response.json()["redirect_uris"] == REAL_CLIENTS[name]
    assert response.json()["client_id"]


@pytest.mark.parametrize(
    "uri",
    [
        "http://evil.example/callback",  # plain http off loopback
        "javascript:alert(1)",
        "https://ok.example/cb#fragment",
        "https://" + "a" * registration.MAX_REDIRECT_URI_LENGTH + ".example/",
    ],
)
def test_a_redirect_uri_out_of_bounds_is_refused_and_nothing_is_stored(uri: str) -> None:
    from oauth2_provider.models import get_application_model

    before = get_application_model().objects.count()
    response = register(public_client("bad", [uri]), address="10.1.0.1")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_redirect_uri"
    assert get_application_model().objects.count() == before


def test_too_many_redirect_uris_are_refused() -> None:
    uris = [f"https://app.example/cb{n}" for n in range(registration.MAX_REDIRECT_URIS + 1)]
    response = register(public_client("many", uris), address="10.1.0.2")
    assert response.status_code == 400
    assert "At most" in response.json()["error_description"]


def test_a_body_over_the_bound_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(registration.RegistrationRefused) as refused:
        registration.check(b"{" + b" " * registration.MAX_BODY_BYTES + b"}", ())
    assert refused.value.error == "invalid_client_metadata"


@pytest.mark.stack  # counted in Redis
def test_registrations_are_rate_limited_per_address(stack: object) -> None:
    answers = [
        register(public_client("flood", ["https://app.example/cb"]), address="10.2.0.1").status_code
        for _ in range(12)
    ]
    assert answers[:10] == [201] * 10
    assert answers[10:] == [429, 429]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.1", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert registration.is_loopback(host) is loopback
