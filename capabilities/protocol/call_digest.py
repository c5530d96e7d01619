"""A call's idempotency key: the same callId with the same call is that call."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def call_digest(capability: str, params: dict[str, Any]) -> str:
    """A digest of the capability and its params, whatever the order of their keys."""
    canonical = json.dumps(
        {"capability": capability, "params": params},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    # Text the database cannot hold (a lone surrogate) still has a digest: the start
    # refuses it, with its reason, after the digest is taken.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
