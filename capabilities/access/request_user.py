"""The Django user behind a plain HTTP request to the app's own JSON endpoints.

One branch per kind of credential, tried in order:
- the signed-in session user (Django's `request.user`);
- an agent key as `Authorization: Bearer abp_...`: its owner, while the key is not
  revoked and the owner is active. A service key (no owner) acts for nobody;
- an OAuth access token as `Authorization: Bearer ...`, issued for this URL (or the
  whole site) with the `jobs` scope: the user who granted it (access/oauth_tokens.py).

A credential in the query string is never taken here: URLs end up in logs, browser
history and Referer headers. Nobody (None) is an answer, not an error: the caller
says 401.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest

from capabilities.access import agent_keys, oauth_tokens

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


def user_for_request(request: HttpRequest) -> AbstractBaseUser | None:
    """The active user the request acts for, or None."""
    session_user = getattr(request, "user", None)
    if session_user is not None and session_user.is_authenticated:
        signed_in: AbstractBaseUser = session_user
        return signed_in
    presented = bearer_of(request)
    if presented and agent_keys.looks_like_key(presented):
        key = agent_keys.find_key(presented)
        if key is None or key.is_revoked or key.owner is None or not key.owner.is_active:
            return None
        agent_keys.record_use(key)
        owner: AbstractBaseUser = key.owner
        return owner
    if presented and oauth_tokens.enabled():
        return _token_user(presented, request)
    return None


def _token_user(presented: str, request: HttpRequest) -> AbstractBaseUser | None:
    """The user of an access token presented at this request's URL, if it is valid."""
    from django.contrib.auth import get_user_model

    resource = oauth_tokens.public_url(request.build_absolute_uri(request.path))
    try:
        grant = oauth_tokens.verify(presented, resource)
    except oauth_tokens.TokenRefused:
        return None
    if oauth_tokens.JOBS_SCOPE not in grant.scopes:
        return None
    user: AbstractBaseUser | None = get_user_model().objects.filter(pk=grant.user_id).first()
    return user


def bearer_of(request: HttpRequest) -> str | None:
    """The credential of an `Authorization: Bearer` header, if the request sent one."""
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
