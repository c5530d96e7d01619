"""The `WWW-Authenticate` challenge of a refused /mcp request (RFC 6750, RFC 9728).

With OAuth on, a client that follows MCP's authorization spec starts from here: the
challenge names the Protected Resource Metadata (`resource_metadata`) and the scope
to ask for. No `error` when no credential was sent (RFC 6750 §3.1); 403 with
`insufficient_scope` when a valid token lacks the scope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from capabilities.access import credentials, oauth_tokens

METADATA_PATH = "/.well-known/oauth-protected-resource"

# Each refusal's RFC 6750 error code: "" for none (no credential sent).
_ERRORS = {
    "missing-credentials": "",
    "insufficient-scope": "insufficient_scope",
    "token-in-query": "invalid_request",
}


def challenge(
    scope: Mapping[str, Any], reason: str, needed: tuple[str, ...] = ()
) -> tuple[int, str]:
    """The HTTP status and `WWW-Authenticate` value refusing a request for `reason`.

    `needed`: every scope the request needs, when that is more than `jobs` (a call to
    a capability that declares scopes): named in one challenge, as MCP asks.
    """
    error = _ERRORS.get(reason, "invalid_token")
    status = 403 if error == "insufficient_scope" else 401
    parts = ["Bearer"]
    attributes: list[str] = []
    if error:
        attributes.append(f'error="{error}"')
    if oauth_tokens.enabled():
        attributes.append(f'resource_metadata="{metadata_url(scope)}"')
        scopes = dict.fromkeys((oauth_tokens.JOBS_SCOPE, *needed))
        attributes.append(f'scope="{" ".join(scopes)}"')
    if error:
        attributes.append(f'error_description="{reason}"')
    return status, " ".join(parts) + (" " + ", ".join(attributes) if attributes else "")


def metadata_url(scope: Mapping[str, Any]) -> str:
    """Where this resource's metadata is: the well-known URL with the path inserted."""
    resource = oauth_tokens.public_url(credentials.resource_url(scope))
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path}"
