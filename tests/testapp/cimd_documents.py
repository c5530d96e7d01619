"""Client ID Metadata Documents for the stack, served without a network.

The toolkit's own fetcher refuses loopback and private addresses (SSRF), and the MCP
SDK accepts only an https `client_metadata_url`: a test cannot serve one for real.
This fetcher answers for `https://agent.test/...` alone, as a document's host would.
"""

from __future__ import annotations

from typing import Any

from oauth2_provider.cimd import CIMDError

HOST = "https://agent.test/"


class FixtureFetcher:
    """`CIMD_METADATA_FETCHER` for the tests: a loopback client's document."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        if not client_id.startswith(HOST):
            raise CIMDError(f"no such client in the tests: {client_id}")
        document = {
            "client_id": client_id,
            "client_name": "CIMD test agent",
            "redirect_uris": ["http://127.0.0.1/callback"],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        return document, 300
