"""`OAUTH2_PROVIDER` for MCP clients: django-oauth-toolkit's settings, as MCP needs them.

A host sets `OAUTH2_PROVIDER = mcp_oauth_settings()` (docs/security.md#oauth-for-mcp-clients).
Each value answers a line of MCP's authorization spec or of RFC 9700, where the
toolkit's default is the older, laxer one.
"""

from __future__ import annotations

from typing import Any

from capabilities.access.oauth_tokens import JOBS_SCOPE

SCOPES = {JOBS_SCOPE: "Run capabilities for you, and see and cancel your jobs"}


def mcp_oauth_settings(**overrides: Any) -> dict[str, Any]:
    """The toolkit's settings for an authorization server MCP clients can use."""
    found: dict[str, Any] = {
        "SCOPES": dict(SCOPES),
        "DEFAULT_SCOPES": [JOBS_SCOPE],
        # And each capability's own (`@capability(..., scopes=[...])`).
        "SCOPES_BACKEND_CLASS": "capabilities.oauth.scopes.CapabilityScopes",
        # Authorization code with PKCE (S256 only), and refresh tokens; nothing else.
        "PKCE_REQUIRED": True,
        "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
        "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
        "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
        "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
        "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
        "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
        # RFC 9207: `iss` on every authorization response, and advertised.
        "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
        # Public clients (every CIMD client, most DCR ones) authenticate with none;
        # Claude uses CIMD only when "none" is listed here.
        "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": [
            "none",
            "client_secret_post",
            "client_secret_basic",
        ],
        # Short-lived access tokens; refresh tokens rotate, and a reused one is refused.
        "ACCESS_TOKEN_EXPIRE_SECONDS": 3600,
        "ROTATE_REFRESH_TOKEN": True,
        "REFRESH_TOKEN_REUSE_PROTECTION": True,
        "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
        "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
        # Exact redirect URIs; loopback clients (Claude Code, the Inspector, VS Code)
        # pick their port at run time. http is for loopback only (oauth/registration.py).
        "ALLOW_LOCALHOST_LOOPBACK": True,
        "ALLOWED_REDIRECT_URI_SCHEMES": ["https", "http", "cursor"],
        # Registration: Client ID Metadata Documents first (MCP 2026-07-28), Dynamic
        # Client Registration for the clients that still use it, open as MCP needs
        # and bounded by oauth/registration.py.
        "CIMD_ENABLED": True,
        "DCR_ENABLED": True,
        "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
        "REQUEST_APPROVAL_PROMPT": "auto",
    }
    found.update(overrides)
    return found
