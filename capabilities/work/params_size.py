"""Whether params fit in so many characters of JSON, without serializing big ones.

Size limits on params (a page token's, the local lane's) are checked on the event
loop for every call: `len(json.dumps(params))` would encode a multi-megabyte input
just to learn it is over. This stops at the first value past the limit.
"""

from __future__ import annotations

import json
from typing import Any


def json_fits(value: Any, limit: int) -> bool:
    """Whether `json.dumps(value, ensure_ascii=False)` is at most `limit` characters."""
    return _size(value, limit) <= limit


def _size(value: Any, budget: int) -> int:
    """The value's JSON length, or any number over `budget` once it is past it."""
    if isinstance(value, str):
        if len(value) + 2 > budget:  # escaping only ever lengthens it
            return budget + 1
        return len(json.dumps(value, ensure_ascii=False))
    if isinstance(value, dict):
        total = 2 + 4 * len(value) - (2 if value else 0)  # braces, ": " and ", "
        for key, item in value.items():
            if total > budget:
                break
            total += _size(key if isinstance(key, str) else json.dumps(key), budget - total)
            total += _size(item, budget - total)
        return total
    if isinstance(value, list | tuple):
        total = 2 + 2 * len(value) - (2 if value else 0)  # brackets and ", "
        for item in value:
            if total > budget:
                break
            total += _size(item, budget - total)
        return total
    return len(json.dumps(value))
