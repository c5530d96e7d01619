"""Access tokens that are JWTs of an external authorization server, checked by its JWKS.

RFC 9068's profile: signed by a key of the server's JWKS (fetched and cached by
PyJWT's `PyJWKClient`), `iss` the configured issuer, `exp` in the future, and `aud`
covering the URL the token is presented at, as for every token here
(access/oauth_tokens.py). A token naming no audience is refused. The user is the
Django user whose username is the configured claim (`sub` by default); one that
does not exist, or is inactive, is refused: a token never creates a user.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jwt
from django.contrib.auth import get_user_model

from capabilities.conf import abp_settings

ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]


class JwtRefused(Exception):
    """The JWT may not be used here; `reason` is a stable refusal reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def enabled() -> bool:
    """Whether JWT access tokens are accepted: a JWKS URL is configured."""
    return bool(abp_settings().OAUTH_JWKS_URL)


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts: a JWS in compact form."""
    return token.count(".") == 2


@cache
def _keys(url: str) -> jwt.PyJWKClient:
    # One client per URL: it caches the key set, and fetches again for an unknown kid.
    return jwt.PyJWKClient(url, cache_keys=True, lifespan=300, timeout=5)


def verify(token: str, resource: str, covers: Any) -> tuple[int, str, tuple[str, ...]]:
    """The user id, client id and scopes of a JWT presented at `resource`; JwtRefused.

    `covers(resource, audiences)`: whether the audiences include the resource.
    """
    settings = abp_settings()
    try:
        key = _keys(settings.OAUTH_JWKS_URL).get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=ALGORITHMS,
            issuer=settings.OAUTH_JWT_ISSUER or None,
            options={"require": ["exp", "iss", "aud"], "verify_aud": False},
        )
    except jwt.PyJWKClientError:
        raise JwtRefused("invalid-credentials") from None
    except jwt.InvalidTokenError:
        raise JwtRefused("invalid-credentials") from None
    audiences = claims.get("aud")
    audiences = [audiences] if isinstance(audiences, str) else list(audiences or [])
    if not audiences or not covers(resource, audiences):
        raise JwtRefused("wrong-audience")
    username = claims.get(settings.OAUTH_JWT_USERNAME_CLAIM)
    model = get_user_model()
    user = model.objects.filter(**{model.USERNAME_FIELD: username}).first()
    if not isinstance(username, str) or user is None:
        raise JwtRefused("invalid-credentials")
    if not user.is_active:
        raise JwtRefused("user-inactive")
    scopes = claims.get("scope", claims.get("scp", ""))
    scopes = scopes.split() if isinstance(scopes, str) else [str(scope) for scope in scopes]
    client_id = str(claims.get("client_id") or claims.get("azp") or "")
    return int(user.pk), client_id, tuple(scopes)
