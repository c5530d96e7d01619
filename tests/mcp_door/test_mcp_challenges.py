"""What /mcp answers a request it refuses: the challenge an OAuth client starts from."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from capabilities.mcp_door import app
from tests.access.test_oauth_tokens import issued, person

METADATA = 'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/mcp"'


def request(authorization: str = "", query: bytes = b"") -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1")]
    if authorization:
        headers.append((b"authorization", authorization.encode()))
    return {
        "type": "http",
        "scheme": "http",
        "method": "POST",
        "path": app.PATH,
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "query_string": query,
    }


def refused(scope: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    principal, response = asyncio.run(app._authenticate(scope))
    assert principal is None
    assert response is not None
    body = json.loads(bytes(response.body))
    return response.status_code, response.headers["www-authenticate"], body["error"]["data"]


def test_no_credential_is_a_401_pointing_at_the_metadata_with_no_error_code() -> None:
    status, challenge, data = refused(request())
    assert status == 401
    assert challenge == f'Bearer {METADATA}, scope="jobs"'
    assert data == {"reason": "missing-credentials"}


@pytest.mark.usefixtures("database")
def test_an_invalid_token_is_a_401_invalid_token() -> None:
    status, challenge, _ = refused(request("Bearer no-such-token"))
    assert status == 401
    assert challenge.startswith('Bearer error="invalid_token", ' + METADATA)


@pytest.mark.usefixtures("database")
def test_a_token_for_no_resource_is_a_401_that_says_so() -> None:
    status, challenge, data = refused(request(f"Bearer {issued(person(), resource=[])}"))
    assert status == 401
    assert 'error="invalid_token"' in challenge
    assert data == {"reason": "wrong-audience"}


@pytest.mark.usefixtures("database")
def test_a_token_without_the_scope_is_a_403_insufficient_scope_naming_it() -> None:
    status, challenge, data = refused(request(f"Bearer {issued(person(), scope='read')}"))
    assert status == 403
    assert 'error="insufficient_scope"' in challenge
    assert 'scope="jobs"' in challenge
    assert METADATA in challenge
    assert data == {"reason": "insufficient-scope"}


@pytest.mark.usefixtures("database")
def test_a_token_in_the_query_string_is_refused_even_when_valid() -> None:
    token = issued(person())
    status, challenge, data = refused(request(query=f"access_token={token}".encode()))
    assert status == 401
    assert 'error="invalid_request"' in challenge
    assert data == {"reason": "token-in-query"}


@pytest.mark.usefixtures("database")
def test_a_valid_token_is_let_in_as_its_user() -> None:
    user = person()
    principal, response = asyncio.run(app._authenticate(request(f"Bearer {issued(user)}")))
    assert response is None
    assert principal is not None
    assert principal.user_id == user.pk


def call_body(tool: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool}}
    ).encode()


def answered(scope: dict[str, Any], body: bytes) -> tuple[int, dict[bytes, bytes]]:
    """What the door sends for a POST of `body` that it refuses before the SDK."""
    sent: list[MutableMapping[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app.MCPDoor()(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"])


@pytest.mark.usefixtures("database")
def test_a_call_that_needs_a_scope_the_token_lacks_is_a_403_naming_every_scope() -> None:
    status, headers = answered(request(f"Bearer {issued(person())}"), call_body("test.scoped"))
    assert status == 403
    challenge = headers[b"www-authenticate"].decode()
    assert 'error="insufficient_scope"' in challenge
    assert 'scope="jobs test:scoped"' in challenge
