"""The app's settings: defaults for every key of `settings.ABP`, the host's merged over them.

A host project sets only what it changes (`ABP = {"MAX_TIMEOUT_MS": 600_000}`); the
rest comes from here. Reads go through `settings.ABP` as before.
"""

from __future__ import annotations


def install() -> None:
    """Merge the host's `settings.ABP` over the defaults (app start, and on change)."""
