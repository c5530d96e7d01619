"""Who may make a call: the capability's Django permissions, then its object-level check.

`@capability(..., permissions=["notes.view_note"], authorize=owns_the_note)` names
them. Permissions are checked with `user.has_perm`, the check with the call's params,
both in the database thread (never `ahas_perm`, which skips every backend without an
async method: django-guardian's and django-rules' among them), before the job is
stored, and again by the worker before it runs: the user may have lost a right, a row
may have changed hands, or the user been deactivated, while the job waited. A key's
scopes (`Principal.may_call`) narrow what its user may call; they never widen it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied

from capabilities.protocol import ErrorCode, WireError
from capabilities.work.registry import CapabilitySpec
from capabilities.work.users import load_user

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

logger = logging.getLogger(__name__)

# The longest reason an `authorize` check's PermissionDenied may put on the wire.
MAX_REASON = 300


def refusal(
    spec: CapabilitySpec, user_id: int | None, params: Mapping[str, Any] | None = None
) -> WireError | None:
    """PERMISSION_DENIED naming what is missing or why, or None.

    Reads the database only for a capability that declares permissions or a check.
    `params`: the call's, which a capability's `authorize` check needs (TypeError
    without them: a check is never skipped by accident).
    """
    if not spec.permissions and spec.authorize is None:
        return None
    user = load_user(user_id)
    if user is None and user_id is not None:
        return _no_active_user(spec)
    return call_refusal(spec, user, params)


def call_refusal(
    spec: CapabilitySpec, user: AbstractBaseUser | None, params: Mapping[str, Any] | None
) -> WireError | None:
    """`refusal` for a user already loaded (None: no active user): permissions, then
    the `authorize` check."""
    return user_refusal(spec, user) or _authorize_refusal(spec, user, params)


def user_refusal(spec: CapabilitySpec, user: AbstractBaseUser | None) -> WireError | None:
    """The permissions alone (what a listing shows): no params, so no `authorize`."""
    if not spec.permissions:
        return None
    if user is None:
        return _no_active_user(spec)
    missing = [p for p in spec.permissions if not user.has_perm(p)]  # type: ignore[attr-defined]
    if not missing:
        return None
    return WireError(
        code=ErrorCode.PERMISSION_DENIED,
        message=f"{spec.name} needs the permission{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)}, which this user does not have.",
        details={"capability": spec.name, "missing": missing},
    )


def _no_active_user(spec: CapabilitySpec) -> WireError:
    needs = f" with {', '.join(spec.permissions)}" if spec.permissions else ""
    return WireError(
        code=ErrorCode.PERMISSION_DENIED,
        message=f"{spec.name} runs only for a signed-in user{needs}; this connection "
        "acts for no active user.",
        details={"capability": spec.name, "missing": list(spec.permissions)},
    )


def _authorize_refusal(
    spec: CapabilitySpec, user: AbstractBaseUser | None, params: Mapping[str, Any] | None
) -> WireError | None:
    """The capability's own answer on these params: anything but True refuses.

    A check that raises anything but PermissionDenied refuses too (INTERNAL_ERROR, its
    traceback logged, never on the wire): a broken check lets nobody through.
    """
    if spec.authorize is None:
        return None
    if params is None:
        raise TypeError(f"{spec.name} has an authorize check: it needs the call's params.")
    try:
        allowed = spec.authorize(user, dict(params))
    except PermissionDenied as denied:
        reason = str(denied)[:MAX_REASON]
    except Exception:
        logger.exception("The authorize check of %s failed", spec.name)
        return WireError(
            code=ErrorCode.INTERNAL_ERROR,
            message=f"{spec.name} could not check whether this call is allowed.",
            retryable=False,
            details={"capability": spec.name},
        )
    else:
        if allowed is True:
            return None
        reason = ""
    said = f": {reason}" if reason else " for this user with these params."
    return WireError(
        code=ErrorCode.PERMISSION_DENIED,
        message=f"{spec.name} is not allowed{said}",
        details={"capability": spec.name, "reason": reason or "not allowed"},
    )
