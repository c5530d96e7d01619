"""JSON Schema `pattern` with the meaning the spec gives it (ECMA-262), not Python's.

Python's `$` also matches before a final newline, so `^(a4|letter)$` accepted
"a4\\n", which the runners, matching whole strings, then refused. Here `$` outside a
character class means the end of the text (`\\Z`), as in ECMA-262 without the
multiline flag, so the schema and the runners agree.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError


def python_pattern(pattern: str) -> str:
    """`pattern` with each end-of-text `$` written as `\\Z`."""
    out: list[str] = []
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(python_pattern(pattern))


def _pattern(
    validator: Any, pattern: str, instance: object, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not _compiled(pattern).search(instance):
        yield ValidationError(f"does not match {pattern!r}")


PatternValidator = validators.extend(Draft202012Validator, {"pattern": _pattern})
