"""A validation error as the operator reads it: one line per refused key, named their way."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

Location = tuple[str | int, ...]


def described(error: ValidationError, name: Callable[[Location], str]) -> str:
    """`<name of the key>: <what is wrong> (got <value>).`, a line each."""
    lines = []
    for detail in error.errors(include_url=False):
        message = str(detail["msg"]).removeprefix("Value error, ")
        shown = detail["type"] not in ("missing", "value_error", "model_type")
        got = f" (got {detail['input']!r})" if shown else ""
        lines.append(f"{name(detail['loc'])}: {message}{got}.")
    return "\n".join(lines)
