"""Short-lived signed tokens that let the app's own pages open the WebSocket.

A page (the `window.abp` page, the demo, the embed bridge) renders one; the
browser sends it as a WebSocket subprotocol. It is signed with the SECRET_KEY,
carries the origin the page was served from (the WebSocket's Origin header must
be that one) and expires after ABP_PAGE_TOKEN_MAX_AGE_SECONDS. It grants what the
page grants: anyone who can load the page can get one. A page served to a signed-in
user carries that user's id as well, so its calls run for that user; the session
cookie itself never opens the WebSocket.

Tokens use `.` between their parts so that they are valid subprotocol names
(RFC 6455 tokens allow no `:`).
"""

from __future__ import annotations

import secrets

from django.core import signing

from capabilities.access.origins import BadOrigin, normalize_origin
from capabilities.conf import abp_settings

SALT = "capabilities.page-token"
START = "page."


class PageTokenError(Exception):
    """A page token that is forged, expired or for another origin."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _signer() -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=SALT, sep=".")


def max_age() -> int:
    """Seconds a token stays valid for opening a connection."""
    return abp_settings().PAGE_TOKEN_MAX_AGE_SECONDS


def issue(origin: str, *, user_id: int | None = None) -> str:
    """A token for pages served from this origin (to this signed-in user, if any)."""
    claims: dict[str, object] = {"o": normalize_origin(origin), "n": secrets.token_hex(4)}
    if user_id is not None:
        claims["u"] = user_id
    return START + _signer().sign_object(claims)


def looks_like_page_token(presented: str) -> bool:
    """Whether a credential is meant as a page token."""
    return presented.startswith(START)


def names_a_user(presented: str) -> bool:
    """Whether a genuine page token was issued to a signed-in user (no other check)."""
    try:
        claims = _signer().unsign_object(presented[len(START) :])
    except (signing.BadSignature, ValueError):
        return False
    return isinstance(claims, dict) and isinstance(claims.get("u"), int)


def verify(presented: str, *, origin: str) -> int | None:
    """The user the page was served to (None: nobody signed in).

    PageTokenError unless the token is genuine, fresh and for this origin.
    """
    try:
        claims = _signer().unsign_object(presented[len(START) :], max_age=max_age())
    except signing.SignatureExpired as error:
        raise PageTokenError("expired-credentials") from error
    except (signing.BadSignature, ValueError) as error:
        raise PageTokenError("invalid-credentials") from error
    try:
        origin = normalize_origin(origin)
    except BadOrigin as error:
        raise PageTokenError("invalid-credentials") from error
    if not isinstance(claims, dict) or claims.get("o") != origin:
        # Signed for pages of another origin (or used outside a browser).
        raise PageTokenError("invalid-credentials")
    user_id = claims.get("u")
    return user_id if isinstance(user_id, int) else None
