"""Text every store can hold: no NUL character, no lone surrogate.

JSON allows both (`"\\u0000"`, `"\\ud800"`); PostgreSQL's text and jsonb refuse NUL,
and UTF-8 has no encoding for a lone surrogate. Refused on arrival, with a code,
they never reach a row or a file.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """What in `text` cannot be stored, in words, or None."""
    if "\x00" in text:
        return "a NUL character"
    if not text.isascii() and _SURROGATE.search(text):
        return "a lone surrogate (not valid UTF-8)"
    return None
