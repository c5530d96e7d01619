"""Agent keys: create (the plaintext is shown once) and verify.

A key is `abp_<prefix>_<secret>`. The row keeps the prefix (to find it, and to show
which key is which) and the SHA-256 of the secret, compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.utils import timezone

from capabilities.models import AgentKey

KEY_START = "abp_"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _split(presented: str) -> tuple[str, str] | None:
    """(prefix, secret) of something shaped like a key, else None."""
    if not presented.startswith(KEY_START):
        return None
    prefix, _, secret = presented[len(KEY_START) :].partition("_")
    if not (8 <= len(prefix) <= 16 and prefix.isalnum() and 20 <= len(secret) <= 200):
        return None
    return prefix, secret


def looks_like_key(presented: str) -> bool:
    """Whether a credential is meant as an agent key (rather than a page token)."""
    return presented.startswith(KEY_START)


def assign_secret(key: AgentKey) -> str:
    """Give an unsaved key row its prefix and hash; returns the plaintext key."""
    prefix = secrets.token_hex(4)
    secret = secrets.token_urlsafe(32)
    key.prefix = prefix
    key.secret_hash = _hash(secret)
    return f"{KEY_START}{prefix}_{secret}"


def create_key(
    name: str,
    *,
    max_concurrent_calls: int | None = None,
    max_queued_calls: int | None = None,
    calls_per_minute: int | None = None,
    max_open_sessions: int | None = None,
    owner: Any = None,
    scopes: Sequence[str] = (),
) -> tuple[AgentKey, str]:
    """A new key: the row, and the plaintext key (never stored, shown once).

    `owner`: the user its calls run for (None: a service key); `scopes`: the
    capabilities it may call (empty: all its owner may).
    """
    key = AgentKey(
        name=name[:200],
        owner=owner,
        scopes=list(scopes),
        max_concurrent_calls=max_concurrent_calls,
        max_queued_calls=max_queued_calls,
        calls_per_minute=calls_per_minute,
        max_open_sessions=max_open_sessions,
    )
    plaintext = assign_secret(key)
    key.save()
    return key, plaintext


def prefix_of(presented: str) -> str | None:
    """The prefix of a well-formed key (its row's lookup id), else None."""
    parts = _split(presented)
    return parts[0] if parts else None


def find_key(presented: str) -> AgentKey | None:
    """The key row this plaintext key belongs to (revoked or not), or None."""
    parts = _split(presented)
    if parts is None:
        return None
    prefix, secret = parts
    # The prefix is unique: no ORDER BY to build (`first()`'s), MCP checks every request.
    # Its owner in the same query: whether they are active is checked with the key.
    key = next(iter(AgentKey.objects.select_related("owner").filter(prefix=prefix)[:1]), None)
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(secret)):
        return None
    return key


# `last_used_at` is for the admin: to the minute is enough, and MCP authenticates every
# request, so the write is skipped while the recorded use is this recent.
USE_RECORDED_WITHIN = timedelta(minutes=1)


def record_use(key: AgentKey) -> None:
    """Note when the key was last used (for the admin), at most once a minute."""
    now = timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < USE_RECORDED_WITHIN:
        return
    AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)


def key_group(prefix: str) -> str:
    """The channel-layer group of every connection opened with this key."""
    return f"abp.key.{prefix}"
