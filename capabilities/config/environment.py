"""A deployment's environment variables as a settings namespace (`ABP_MAX_TIMEOUT_MS=5000`).

Each key of a model is read from the prefix plus its name and converted by the key's
type: numbers as written; switches as 1/0, true/false, yes/no or on/off; lists
comma-separated; maps as `key=value,key=value`. A variable that is unset (or empty, for a
number or a switch) is left out, so the default holds. A value the key's type refuses
is an error naming the variable.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from capabilities.config.errors import Location, described

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def from_environment(
    model: type[BaseModel],
    environ: Mapping[str, str],
    *,
    prefix: str,
    under: Mapping[str, Any] | None = None,
    skip: Collection[str] = (),
) -> dict[str, Any]:
    """The keys of `model` that `environ` sets, over `under`, typed and checked.

    `skip` names keys read some other way. ValueError naming each refused variable.
    """
    found = dict(under or {})
    for key, field in model.model_fields.items():
        text = environ.get(prefix + key)
        parse = _parser(field.annotation)
        if key in skip or text is None or parse is None:
            continue
        value = parse(text.strip())
        if value is not _UNSET:
            found[key] = value
    try:
        checked = model.model_validate(found)
    except ValidationError as error:
        raise ValueError(described(error, _variable(prefix))) from None
    return checked.model_dump(include=set(found))


def _variable(prefix: str) -> Callable[[Location], str]:
    def name(location: Location) -> str:
        return prefix + "_".join(str(part).upper() for part in location) if location else prefix

    return name


_UNSET: Any = object()


def _parser(annotation: Any) -> Callable[[str], Any] | None:
    """How to read a key of this type from text (None: not from the environment)."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return _switch
    if origin in (tuple, list):
        return _items
    if origin is dict:
        return _pairs
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return None
    return lambda text: text if text or annotation is str else _UNSET


def _switch(text: str) -> Any:
    lowered = text.lower()
    if not lowered:
        return _UNSET
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    return text  # refused by the type, with the variable named


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _pairs(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in _items(text))
    return {key.strip(): value.strip() for key, _, value in pairs if key.strip() and value.strip()}
