"""Keys a user owns: what they may scope one to, how many they may hold, making one.

A signed-in user makes their own agent keys on "Your keys" (capabilities/web/your_keys.py).
A key's scopes narrow what its owner may call and never widen it: a key may be scoped
only to capabilities its owner may call now (every call is checked again when it
starts, so a right the owner loses later is lost to the key too). How many keys a
user holds (`ABP["MAX_KEYS_PER_USER"]`, counting those not revoked) is checked before
anything is stored. Revoking is the admin's code, `endings.key_revocation.revoke`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet

from capabilities.access import agent_keys, permissions
from capabilities.conf import abp_settings
from capabilities.models import AgentKey
from capabilities.work import registry
from capabilities.work.registry import CapabilitySpec

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


class Refusal(StrEnum):
    """Why a user may not have the key they asked for: a stable code."""

    TOO_MANY_KEYS = "too-many-keys"
    """The user already holds MAX_KEYS_PER_USER keys that are not revoked."""
    SCOPE_NOT_ALLOWED = "scope-not-allowed"
    """A scope names a capability the user may not call (or one not registered)."""


class KeyRefused(Exception):
    """No key was made; `code` says why, `message` says it to the user."""

    def __init__(self, code: Refusal, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def callable_by(user: AbstractBaseUser) -> tuple[CapabilitySpec, ...]:
    """The capabilities this user may call: each whose permissions the user has."""
    return tuple(
        spec for spec in registry.all_specs() if permissions.user_refusal(spec, user) is None
    )


def keys_of(user: AbstractBaseUser) -> QuerySet[AgentKey]:
    """The user's own keys, revoked ones too, newest first."""
    return AgentKey.objects.filter(owner_id=user.pk).order_by("-created_at")


def create_own_key(
    owner: AbstractBaseUser, *, name: str, scopes: Sequence[str] = ()
) -> tuple[AgentKey, str]:
    """A new key of `owner`'s: the row and its plaintext (shown once, never stored).

    `scopes`: the capabilities it may call, each one the owner may call; empty: every
    one the owner may. KeyRefused, with nothing stored, past the bound or for a scope
    the owner may not call.
    """
    wanted = list(dict.fromkeys(scopes))
    allowed = {spec.name for spec in callable_by(owner)}
    refused = [scope for scope in wanted if scope not in allowed]
    if refused:
        raise KeyRefused(
            Refusal.SCOPE_NOT_ALLOWED,
            f"You may not call {', '.join(refused)}, so no key of yours may be scoped to "
            f"{'it' if len(refused) == 1 else 'them'}.",
        )
    bound = abp_settings().MAX_KEYS_PER_USER
    with transaction.atomic():
        # The owner's row locked (PostgreSQL; SQLite's IMMEDIATE transactions take the
        # write lock at once): two requests cannot both take the last place.
        users = get_user_model()._default_manager
        list(users.select_for_update().filter(pk=owner.pk).values_list("pk", flat=True))
        held = keys_of(owner).filter(revoked_at__isnull=True).count()
        if held >= bound:
            raise KeyRefused(
                Refusal.TOO_MANY_KEYS,
                f"You hold {held} keys, the most one user may: revoke one you no longer "
                "use to make another.",
            )
        return agent_keys.create_key(name, owner=owner, scopes=wanted)
