"""OAuth 2.1 access tokens as credentials: who they act for, and our audience rule.

django-oauth-toolkit (the `[oauth]` extra) checks the token: its own rows, or an
external server's by introspection (RFC 7662, `RESOURCE_SERVER_INTROSPECTION_URL`),
expiry, revocation and the RFC 8707 audience. It lets a token issued for no resource
through ("unrestricted"); MCP says a server MUST accept only tokens issued for it, so
here a token must name a resource, and the URL it is presented at must fall under it
(docs/security.md#oauth-for-mcp-clients). An external server's JWTs are checked
against its JWKS instead (access/jwt_tokens.py), under the same rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.apps import apps

from capabilities.access import jwt_tokens

# The one scope the app defines: call capabilities, and see and cancel your own jobs.
JOBS_SCOPE = "jobs"


class TokenRefused(Exception):
    """The token may not be used here; `reason` is a stable refusal reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Grant:
    """What a valid token grants: a user, through a client, within scopes."""

    user_id: int
    client_id: str
    scopes: tuple[str, ...]


# RFC 6750's b64token, bounded: what an access token can be at all.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_TOKEN_LENGTH = 8192


def well_formed(token: str) -> bool:
    """Whether `token` could be an access token (RFC 6750 §2.1's syntax, bounded)."""
    return len(token) <= MAX_TOKEN_LENGTH and _TOKEN.fullmatch(token) is not None


def enabled() -> bool:
    """Whether access tokens are accepted: django-oauth-toolkit is installed."""
    return apps.is_installed("oauth2_provider")


def public_url(derived: str) -> str:
    """The URL a token is checked against: `derived` from the request, unless the
    toolkit's OAUTH2_PROTECTED_RESOURCE_IDENTIFIER names this path's public URL
    (behind a proxy that rewrites the host or the scheme)."""
    from oauth2_provider.settings import oauth2_settings

    configured = str(oauth2_settings.OAUTH2_PROTECTED_RESOURCE_IDENTIFIER or "")
    if configured and urlsplit(configured).path == urlsplit(derived).path:
        return configured
    return derived


def verify(token: str, resource: str) -> Grant:
    """The grant of `token` presented at `resource` (a URL); TokenRefused if none.

    Synchronous (the database, or an introspection request): call it from a thread.
    """
    from oauth2_provider.settings import oauth2_settings
    from oauthlib.common import Request

    if jwt_tokens.enabled() and jwt_tokens.looks_like_jwt(token):
        covers = oauth2_settings.RESOURCE_SERVER_TOKEN_RESOURCE_VALIDATOR
        try:
            user_id, client_id, scopes = jwt_tokens.verify(token, resource, covers)
        except jwt_tokens.JwtRefused as refused:
            raise TokenRefused(refused.reason) from refused
        return Grant(user_id=user_id, client_id=client_id, scopes=scopes)
    request = Request(uri=resource)
    validator = oauth2_settings.OAUTH2_VALIDATOR_CLASS()
    if not validator.validate_bearer_token(token, [], request):
        error: dict[str, Any] = getattr(request, "oauth2_error", None) or {}
        audience = "resource" in str(error.get("error_description", ""))
        raise TokenRefused("wrong-audience" if audience else "invalid-credentials")
    access_token = request.access_token
    if not access_token.resource:
        # The toolkit's default lets an unrestricted token through; MCP does not.
        raise TokenRefused("wrong-audience")
    user = access_token.user
    if user is None:
        raise TokenRefused("invalid-credentials")  # client credentials: for nobody
    if not user.is_active:
        raise TokenRefused("user-inactive")
    application = access_token.application
    return Grant(
        user_id=user.pk,
        client_id=application.client_id if application is not None else "",
        scopes=tuple(access_token.scope.split()),
    )
