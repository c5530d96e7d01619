"""The user a job runs for, as capability code sees it (`ctx.user`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


def load_user(user_id: int | None) -> AbstractBaseUser | None:
    """The active user with this id; None for no user, or one deleted or deactivated."""
    if user_id is None:
        return None
    users = get_user_model()
    user: AbstractBaseUser | None = users._default_manager.filter(
        pk=user_id, is_active=True
    ).first()
    return user
