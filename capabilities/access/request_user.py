"""The Django user behind a plain HTTP request to the app's own JSON endpoints.

One branch per kind of credential, tried in order:
- the signed-in session user (Django's `request.user`);
- an agent key as `Authorization: Bearer abp_...`: its owner, while the key is not
  revoked and the owner is active. A service key (no owner) acts for nobody.

A credential in the query string is never taken here: URLs end up in logs, browser
history and Referer headers. Nobody (None) is an answer, not an error: the caller
says 401.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest

from capabilities.access import agent_keys

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
    return None


def bearer_of(request: HttpRequest) -> str | None:
    """The credential of an `Authorization: Bearer` header, if the request sent one."""
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
