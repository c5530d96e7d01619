"""The capabilities as agents see them: name, schemas, timeouts and availability."""

from __future__ import annotations

from typing import Any

from capabilities.work import registry


def capability_entries(available: dict[str, bool]) -> list[dict[str, Any]]:
    """Every capability's manifest entry, with whether a live worker can run it now."""
    return [
        {**spec.describe(), "available": available.get(spec.name, False)}
        for spec in registry.all_specs()
    ]
