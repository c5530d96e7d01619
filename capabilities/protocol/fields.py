"""Typed reads of a JSON object's fields; a mismatch is a `FieldError` naming the field.

The one field reader of the app. The codec reads envelope payloads with it, where it
is the only check; capability runners read params with it that their JSON Schema
already checked, where it only types them. JSON null reads as absent.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from capabilities.protocol.errors import ErrorCode
from capabilities.protocol.text import unstorable

_T = TypeVar("_T")
_E = TypeVar("_E", bound=Enum)


class FieldError(Exception):
    """A field is missing or unusable: a wire code, a message, and the field's path."""

    def __init__(self, code: ErrorCode, message: str, path: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


class Fields:
    """One JSON object's fields; `path` names the object in errors (`payload.options`)."""

    def __init__(self, data: dict[str, Any], path: str) -> None:
        self.data = data
        self.path = path

    def where(self, key: str) -> str:
        """The path of a field, as errors name it."""
        return f"{self.path}.{key}"

    def get(self, key: str) -> Any:
        """The field's raw JSON value; None when absent or null."""
        return self.data.get(key)

    def object(self, key: str) -> Fields:
        """A nested object's fields; absent reads as an empty object."""
        value = self.get(key)
        return Fields({}, self.where(key)) if value is None else _object(value, self.where(key))

    def objects(self, key: str) -> list[Fields]:
        """An array of objects, each read as fields; absent reads as empty."""
        return [_object(item, where) for where, item in self._items(key)]

    def texts(self, key: str) -> list[str]:
        """An array of strings every store can hold; absent reads as empty."""
        texts: list[str] = []
        for where, item in self._items(key):
            if not isinstance(item, str):
                raise _wrong_type(where, "a string")
            texts.append(_storable(item, where))
        return texts

    def string(self, key: str) -> str:
        """A required string."""
        return self._required(key, self.optional_string(key), None)

    def optional_string(self, key: str) -> str | None:
        """A string, or None."""
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise _wrong_type(self.where(key), "a string")
        return value

    def text(self, key: str) -> str:
        """A required string that every store can hold (no NUL, no lone surrogate)."""
        return self._required(key, self.optional_text(key), None)

    def optional_text(self, key: str) -> str | None:
        """A string that every store can hold, or None."""
        value = self.optional_string(key)
        return None if value is None else _storable(value, self.where(key))

    def boolean(self, key: str, default: bool) -> bool:
        """A boolean; `default` when absent."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise _wrong_type(self.where(key), "a boolean")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        """An integer; `default` when absent, required without one."""
        return self._required(key, self.optional_integer(key), default)

    def optional_integer(self, key: str) -> int | None:
        """An integer, or None. A float with no fraction (`3.0`) is one, as in JSON Schema."""
        value = self.get(key)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise _wrong_type(self.where(key), "an integer")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        """A number, as a float; `default` when absent, required without one."""
        value = self.get(key)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise _wrong_type(self.where(key), "a number")
        return self._required(key, None if value is None else float(value), default)

    def choice(self, key: str, kind: type[_E], default: _E | None = None) -> _E:
        """A member of `kind`, by value; `default` when absent, required without one."""
        return self._required(key, self.optional_choice(key, kind), default)

    def optional_choice(self, key: str, kind: type[_E]) -> _E | None:
        """A member of `kind`, by value, or None."""
        value = self.optional_string(key)
        if value is None:
            return None
        try:
            return kind(value)
        except ValueError:
            where = self.where(key)
            choices = ", ".join(str(member.value) for member in kind)
            message = f"'{where}' must be one of: {choices}."
            raise FieldError(ErrorCode.INVALID_PARAMS, message, where) from None

    def _items(self, key: str) -> list[tuple[str, Any]]:
        """An array's items, each with its path (`payload.list[2]`); absent reads as empty."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise _wrong_type(self.where(key), "an array")
        return [(f"{self.where(key)}[{index}]", item) for index, item in enumerate(value)]

    def _required(self, key: str, value: _T | None, default: _T | None) -> _T:
        if value is not None:
            return value
        if default is not None:
            return default
        where = self.where(key)
        raise FieldError(ErrorCode.MISSING_PARAM, f"'{where}' is required.", where)


def _object(value: Any, path: str) -> Fields:
    if not isinstance(value, dict):
        raise _wrong_type(path, "an object")
    return Fields(value, path)


def _storable(text: str, path: str) -> str:
    """`text`, if every store can hold it (no NUL, no lone surrogate)."""
    problem = unstorable(text)
    if problem is not None:
        raise FieldError(ErrorCode.INVALID_PARAMS, f"'{path}' must not contain {problem}.", path)
    return text


def _wrong_type(path: str, what: str) -> FieldError:
    return FieldError(ErrorCode.INVALID_TYPE, f"'{path}' must be {what}.", path)
