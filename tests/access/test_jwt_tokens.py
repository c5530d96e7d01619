"""An external authorization server's JWT access tokens, checked against its JWKS.

The JWKS is served over real HTTP, on loopback, as the server would serve it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.test import override_settings

from capabilities.access import oauth_tokens

pytestmark = pytest.mark.usefixtures("database")

ISSUER = "https://idp.example.test"
MCP = "http://127.0.0.1/mcp"
SIGNING = rsa.generate_private_key(public_exponent=65537, key_size=2048)
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Keys(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(SIGNING.public_key()))
        body = json.dumps({"keys": [{**public, "kid": "one", "use": "sig", "alg": "RS256"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def jwks() -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    try:
        with override_settings(ABP={"OAUTH_JWKS_URL": url, "OAUTH_JWT_ISSUER": ISSUER}):
            yield
    finally:
        server.shutdown()
        server.server_close()


def token_for(username: str, *, key: Any = SIGNING, **claims: Any) -> str:
    found = {
        "iss": ISSUER,
        "sub": username,
        "aud": MCP,
        "exp": int(time.time()) + 600,
        "scope": "jobs",
        "client_id": "claude",
        **claims,
    }
    return jwt.encode(found, key, algorithm="RS256", headers={"kid": "one"})


def person(*, active: bool = True) -> str:
    name = f"j-{uuid.uuid4().hex[:10]}"
    get_user_model().objects.create_user(username=name, is_active=active)
    return name


def refusal(token: str) -> str:
    with pytest.raises(oauth_tokens.TokenRefused) as refused:
        oauth_tokens.verify(token, MCP)
    return refused.value.reason


@pytest.mark.usefixtures("jwks")
def test_a_jwt_of_the_issuer_for_this_server_acts_for_the_user_it_names() -> None:
    name = person()
    grant = oauth_tokens.verify(token_for(name), MCP)
    assert grant.user_id == get_user_model().objects.get(username=name).pk
    assert grant.client_id == "claude"
    assert grant.scopes == ("jobs",)


@pytest.mark.usefixtures("jwks")
def test_a_jwt_for_no_audience_or_another_is_refused() -> None:
    name = person()
    assert refusal(token_for(name, aud=[])) == "wrong-audience"
    assert refusal(token_for(name, aud="https://other.example/mcp")) == "wrong-audience"


@pytest.mark.usefixtures("jwks")
@pytest.mark.parametrize(
    "claims",
    [
        {"iss": "https://someone-else.example"},
        {"exp": int(time.time()) - 10},
    ],
)
def test_a_jwt_of_another_issuer_or_expired_is_invalid(claims: dict[str, Any]) -> None:
    assert refusal(token_for(person(), **claims)) == "invalid-credentials"


@pytest.mark.usefixtures("jwks")
def test_a_jwt_signed_by_another_key_is_invalid() -> None:
    assert refusal(token_for(person(), key=STRANGER)) == "invalid-credentials"


@pytest.mark.usefixtures("jwks")
def test_a_jwt_never_makes_a_user_nor_revives_a_deactivated_one() -> None:
    assert refusal(token_for("nobody-here")) == "invalid-credentials"
    assert refusal(token_for(person(active=False))) == "user-inactive"
