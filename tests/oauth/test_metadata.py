"""The metadata documents an MCP client reads first, checked field by field.

Neither SDK refuses a server that omits `code_challenge_methods_supported`, so only a
direct check catches it (MCP 2025-11-25, authorization: clients MUST refuse).
"""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.usefixtures("database")

ORIGIN = "http://127.0.0.1"


def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def test_protected_resource_metadata_names_mcp_and_its_authorization_server() -> None:
    response = client().get("/.well-known/oauth-protected-resource/mcp")
    assert response.status_code == 200
    document = response.json()
    assert document["resource"] == f"{ORIGIN}/mcp"
    assert document["authorization_servers"] == [ORIGIN]
    # `jobs`, and the scopes capabilities declare (the test app's `test.scoped`).
    assert document["scopes_supported"] == ["jobs", "test:scoped"]
    assert document["bearer_methods_supported"] == ["header"]
    assert "offline_access" not in document["scopes_supported"]


def test_authorization_server_metadata_is_what_mcp_clients_require() -> None:
    response = client().get("/.well-known/oauth-authorization-server")
    assert response.status_code == 200
    document = response.json()
    # The issuer is the URL the document was fetched from, minus the well-known part.
    assert document["issuer"] == ORIGIN
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["response_types_supported"] == ["code"]
    assert document["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert "none" in document["token_endpoint_auth_methods_supported"]
    assert document["client_id_metadata_document_supported"] is True
    assert document["authorization_response_iss_parameter_supported"] is True
    assert document["authorization_endpoint"] == f"{ORIGIN}/o/authorize"
    assert document["token_endpoint"] == f"{ORIGIN}/o/token"
    assert document["registration_endpoint"] == f"{ORIGIN}/o/register"
    assert document["revocation_endpoint"] == f"{ORIGIN}/o/revoke_token"


@pytest.mark.parametrize("path", ["/o/register", "/o/token", "/o/revoke_token", "/o/introspect"])
def test_no_endpoint_redirects_a_post_that_drops_the_trailing_slash(path: str) -> None:
    response = client().post(path, data=b"{}", content_type="application/json")
    assert response.status_code not in (301, 302, 307, 308)
