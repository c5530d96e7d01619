"""Django permissions per capability: what a call's user must have to make it.

`@capability(..., permissions=["notes.view_note"])` names them. They are checked
with `user.has_perm`, in the database thread (never `ahas_perm`, which skips every
backend without an async method: django-guardian's and django-rules' among them),
before the job is stored, and again by the worker before it runs: the user may have
lost a right, or been deactivated, while the job waited. A key's scopes
(`Principal.may_call`) narrow what its user may call; they never widen it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capabilities.protocol import ErrorCode, WireError
from capabilities.work.registry import CapabilitySpec
from capabilities.work.users import load_user

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


def refusal(spec: CapabilitySpec, user_id: int | None) -> WireError | None:
    """PERMISSION_DENIED naming what is missing, or None. Reads the database only
    for a capability that declares permissions."""
    if not spec.permissions:
        return None
    return user_refusal(spec, load_user(user_id))


def user_refusal(spec: CapabilitySpec, user: AbstractBaseUser | None) -> WireError | None:
    """`refusal` for a user already loaded (None: no active user)."""
    if not spec.permissions:
        return None
    if user is None:
        return WireError(
            code=ErrorCode.PERMISSION_DENIED,
            message=f"{spec.name} runs only for a signed-in user with "
            f"{', '.join(spec.permissions)}; this connection acts for no active user.",
            details={"capability": spec.name, "missing": list(spec.permissions)},
        )
    missing = [p for p in spec.permissions if not user.has_perm(p)]  # type: ignore[attr-defined]
    if not missing:
        return None
    return WireError(
        code=ErrorCode.PERMISSION_DENIED,
        message=f"{spec.name} needs the permission{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)}, which this user does not have.",
        details={"capability": spec.name, "missing": missing},
    )
