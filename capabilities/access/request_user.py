"""The Django user behind a plain HTTP request to the app's own JSON endpoints.

The signed-in session user (Django's `request.user`), else the user an
`Authorization: Bearer` credential acts for, checked exactly as the doors check it
(access/credentials.py): an agent key's active owner, an OAuth access token issued
for this URL (or the whole site) with the `jobs` scope. A service key acts for
nobody. A credential in the query string is never taken here: URLs end up in logs,
browser history and Referer headers. Nobody (None) is an answer, not an error: the
caller says 401.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest

from capabilities.access import credentials
from capabilities.work.users import load_user

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


def user_for_request(request: HttpRequest) -> AbstractBaseUser | None:
    """The active user the request acts for, or None."""
    session_user = getattr(request, "user", None)
    if session_user is not None and session_user.is_authenticated:
        signed_in: AbstractBaseUser = session_user
        return signed_in
    if bearer_of(request) is None:
        return None
    try:
        principal = credentials.authenticate(_scope_of(request), query=False)
    except credentials.Refused:
        return None
    return load_user(principal.user_id) if principal.kind in ("key", "token") else None


def bearer_of(request: HttpRequest) -> str | None:
    """The credential of an `Authorization: Bearer` header, if the request sent one."""
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _scope_of(request: HttpRequest) -> dict[str, Any]:
    """The request as the doors' credential check reads a connection."""
    return {
        "type": "http",
        "scheme": request.scheme,
        "path": request.path,
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.items()
        ],
        "client": (str(request.META.get("REMOTE_ADDR", "")), 0),
        "query_string": b"",
    }
