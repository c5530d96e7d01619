"""The one list of what agents may call: names, JSON Schemas, limits, runners.

`initialize-result.capabilities`, the manifest and param validation all read it.
Capabilities are registered at app start, when every installed app's
`abp_capabilities` module is imported (the built-ins' first: capabilities/abp_capabilities.py)
and its `@capability` functions (`declare.py`) call `register`.
A capability's JSON Schema, with the server's limits from settings put in it, is
the one check of its params, made here on the consumer side before a job row is
written or a task queued. Runners read the params into typed values without checking
them again; they check only what no schema can say (a decoded image's pixels, a
document's pages). The built-ins import their libraries only where they run (the
worker), so the web process never loads WeasyPrint or Pillow.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, cast

from django.utils.module_loading import autodiscover_modules, import_string
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from capabilities.conf import abp_settings
from capabilities.config.schema import AbpSettings
from capabilities.protocol import ErrorCode, WireError
from capabilities.protocol.text import unstorable
from capabilities.work.context import Runner
from capabilities.work.schema_patterns import PatternValidator

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

# The app whose `abp_capabilities` module holds the built-ins, imported first.
BUILT_INS = "capabilities.abp_capabilities"

# An object-level check (`@capability(authorize=...)`): the call's user (None: nobody)
# and its JSON params in; True lets the call go on. It may raise Django's
# PermissionDenied("why") to give the reason.
Authorize = Callable[["AbstractBaseUser | None", dict[str, Any]], bool]


def _integer_setting(name: str) -> int:
    """The integer key `name` of ABP (a capability's limit; checked when declared)."""
    return cast(int, getattr(abp_settings(), name))


def _require_integer_setting(name: str) -> None:
    field = AbpSettings.model_fields.get(name)
    if field is None or field.annotation is not int:
        raise TypeError(f"{name!r} is not an integer key of settings.ABP.")


@dataclass(frozen=True, kw_only=True)
class SizeLimit:
    """The largest a string parameter may be: `ABP[setting]` bytes.

    `path` leads through the params' objects to the string. With `base64`, the
    setting bounds the decoded bytes; the text may then be 4/3 of it, plus line breaks.
    """

    path: tuple[str, ...]
    setting: str
    base64: bool = False

    def __post_init__(self) -> None:
        _require_integer_setting(self.setting)

    @property
    def where(self) -> str:
        """The parameter's path as errors name it."""
        return ".".join(("params", *self.path))

    def max_bytes(self) -> int:
        """The setting's value."""
        return _integer_setting(self.setting)

    def max_length(self) -> int:
        """The most characters the parameter may have (the schema's maxLength)."""
        limit = self.max_bytes()
        if not self.base64:
            return limit
        characters = 4 * -(-limit // 3)
        return characters + 2 * (characters // 76 + 1)  # MIME's CRLF every 76

    def check(self, params: dict[str, Any]) -> WireError | None:
        """INVALID_PARAMS if the parameter is over the limit; None otherwise or if absent."""
        value: Any = params
        for key in self.path:
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, str):
            return None
        limit = self.max_bytes()
        # A character is 1 to 4 bytes in UTF-8: encode only when the length can't tell.
        over = len(value) > self.max_length() or (
            not self.base64
            and len(value) * 4 > limit
            and len(value.encode("utf-8", "surrogatepass")) > limit
        )
        if not over:
            return None
        what = "decoded bytes" if self.base64 else "bytes (UTF-8)"
        return WireError(
            code=ErrorCode.INVALID_PARAMS,
            message=f"'{self.where}' is larger than {limit} {what}.",
            details={"path": self.where, "rule": "maxLength", "limit": limit},
        )


@dataclass(frozen=True, kw_only=True)
class SettingMaximum:
    """Integer parameters at most `ABP[setting]`, besides their schema's `maximum`.

    Each of `nodes` leads through the input schema (keys, and indexes into lists) to
    one parameter's own schema; the lower of the two maxima is the one published.
    """

    nodes: tuple[tuple[str | int, ...], ...]
    setting: str

    def __post_init__(self) -> None:
        _require_integer_setting(self.setting)

    def value(self) -> int:
        """The setting's value."""
        return _integer_setting(self.setting)


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """A call's timeout when it gives none, and the longest it may ask for (ms)."""

    default_ms: int
    max_ms: int


@dataclass(frozen=True, kw_only=True)
class CapabilitySpec:
    """A capability as agents see it, plus its runner (`@capability` builds one)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    # The runner, or its dotted path (imported only where it runs).
    runner: Runner | str
    # Optional: a function (or its dotted path) the worker calls once before forking
    # (imports, caches).
    warm_up: Callable[[], object] | str | None = None
    # String parameters bounded by a setting; the manifest shows them as maxLength.
    size_limits: tuple[SizeLimit, ...] = ()
    # Integer parameters bounded by a setting; the manifest shows them as maximum.
    setting_maxima: tuple[SettingMaximum, ...] = ()
    # Unset: ABP's DEFAULT_TIMEOUT_MS / MAX_TIMEOUT_MS, which also cap these.
    default_timeout_ms: int | None = None
    max_timeout_ms: int | None = None
    # Which queue runs it: a cost class, "small" (milliseconds, little memory) or
    # "heavy" (abp_settings().QUEUES), or the name of a queue of its own.
    cost: str = "heavy"
    # Django permissions ("app_label.codename") the calling user must have, checked
    # before the job is stored and again in the worker before it runs.
    permissions: tuple[str, ...] = ()
    # The object-level check on the params, run at the same two points, after them.
    authorize: Authorize | None = None
    # OAuth scopes an access token must carry to call it, beyond `jobs`
    # (docs/security.md#oauth-for-mcp-clients). Agent keys and pages are not asked.
    scopes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """The manifest entry."""
        timeouts = self.timeouts()
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.schema(),
            "outputSchema": self.output_schema,
            "timeout": {"defaultMs": timeouts.default_ms, "maxMs": timeouts.max_ms},
        }

    def schema(self) -> dict[str, Any]:
        """The input schema, with the settings' limits as maxLength and maximum."""
        return _schema_with_limits(self.name, *self._limits())

    def timeouts(self) -> Timeouts:
        """This capability's timeouts, within the server's maximum."""
        abp = abp_settings()
        ceiling = abp.MAX_TIMEOUT_MS
        max_ms = min(self.max_timeout_ms or ceiling, ceiling)
        default_ms = min(self.default_timeout_ms or abp.DEFAULT_TIMEOUT_MS, max_ms)
        return Timeouts(default_ms=default_ms, max_ms=max_ms)

    def validate(self, params: dict[str, Any]) -> WireError | None:
        """Check params before anything is stored; the first problem, coded, or None.

        Sizes first (cheap, and a huge value is never handed to the schema), then
        text no store can hold, then the JSON Schema.
        """
        for limit in self.size_limits:
            error = limit.check(params)
            if error is not None:
                return error
        error = _unstorable_text(params)
        if error is not None:
            return error
        validator = _validator(self.name, *self._limits())
        if validator.is_valid(params):  # the common case: skip collecting errors
            return None
        best = _best_error(validator, params)
        return None if best is None else _wire_error(best)

    def load_runner(self) -> Runner:
        """The runner, imported if given by path (in the worker)."""
        if isinstance(self.runner, str):
            return cast(Runner, import_string(self.runner))
        return self.runner

    def prepare(self) -> None:
        """Import the runner and run its warm-up, if any (worker start)."""
        self.load_runner()
        if isinstance(self.warm_up, str):
            import_string(self.warm_up)()
        elif self.warm_up is not None:
            self.warm_up()

    def _limits(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The settings' limits now: lengths, then maxima (the cached schemas' keys)."""
        lengths = tuple(limit.max_length() for limit in self.size_limits)
        return lengths, tuple(maximum.value() for maximum in self.setting_maxima)


def _unstorable_text(params: dict[str, Any]) -> WireError | None:
    """INVALID_PARAMS for the first key or string no store can hold (NUL, lone surrogate)."""
    # Iterative: params may nest as deep as the JSON parser allowed.
    pending: list[tuple[str, Any]] = [("params", params)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            problem = unstorable(value)
        elif isinstance(value, dict):
            problem = next(filter(None, (unstorable(str(key)) for key in value)), None)
            pending.extend((f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            problem = None
            pending.extend((f"{path}[{index}]", item) for index, item in enumerate(value))
        else:
            problem = None
        if problem is not None:
            where = _shorten(path, 100)
            return WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"'{where}' must not contain {problem}.",
                details={"path": where, "rule": "storableText"},
            )
    return None


@functools.cache
def _schema_with_limits(
    name: str, lengths: tuple[int, ...], maxima: tuple[int, ...]
) -> dict[str, Any]:
    # Keyed by the limits' values too: settings can change them (tests do).
    spec = require(name)
    # A JSON copy, not a deep copy, which would keep a dict the schema shares between
    # parameters shared: a limit set on one parameter must not reach the others.
    schema: dict[str, Any] = json.loads(json.dumps(spec.input_schema))
    for limit, length in zip(spec.size_limits, lengths, strict=True):
        node = schema
        for key in limit.path:
            node = node["properties"][key]
        node["maxLength"] = length
    for maximum, value in zip(spec.setting_maxima, maxima, strict=True):
        for path in maximum.nodes:
            place: Any = schema
            for step in path:
                place = place[step]
            place["maximum"] = min(place.get("maximum", value), value)
    return schema


@functools.cache
def _validator(
    name: str, lengths: tuple[int, ...], maxima: tuple[int, ...]
) -> Draft202012Validator:
    # Keyed by name: specs are immutable and loaded once per process.
    validator: Draft202012Validator = PatternValidator(_schema_with_limits(name, lengths, maxima))
    return validator


def _best_error(validator: Draft202012Validator, params: dict[str, Any]) -> ValidationError | None:
    errors = sorted(validator.iter_errors(params), key=lambda e: (len(e.path), str(e.path)))
    return _specific(errors[0]) if errors else None


def _specific(error: ValidationError) -> ValidationError:
    """For a `oneOf` of tagged variants (operations), the error inside the variant meant.

    "Not valid under any of the given schemas" names no field; the variant whose
    `type` constant matched is the one the agent meant, and its first error does.
    """
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        return error
    by_branch: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        by_branch.setdefault(sub.schema_path[0] if sub.schema_path else -1, []).append(sub)
    meant = [
        branch
        for branch in by_branch.values()
        if not any(e.validator == "const" and list(e.relative_path) == ["type"] for e in branch)
    ]
    if len(meant) != 1:
        return error
    return _specific(min(meant[0], key=lambda e: (len(e.path), str(e.path))))


def _wire_error(error: ValidationError) -> WireError:
    path = "params" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else ""
        path = f"{path}.{missing}" if missing else path
        code = ErrorCode.MISSING_PARAM
        message = f"Missing parameter '{path}'."
    elif error.validator == "type":
        code = ErrorCode.INVALID_TYPE
        message = f"'{path}' must be of type {error.validator_value}."
    else:
        code = ErrorCode.INVALID_PARAMS
        # jsonschema's message can quote the whole (possibly huge) value: keep it short.
        message = f"'{path}' is invalid: {_shorten(error.message)}"
    return WireError(code=code, message=message, details={"path": path, "rule": error.validator})


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class DuplicateCapability(ValueError):
    """Two capabilities with one name: each name is one capability, project-wide."""


_registered: dict[str, CapabilitySpec] = {}


def register(spec: CapabilitySpec) -> CapabilitySpec:
    """Add a capability (at app start, from its `abp_capabilities` module)."""
    known = _registered.get(spec.name)
    if known is not None and known is not spec:
        raise DuplicateCapability(
            f"Capability {spec.name!r} is registered twice ({_where(known)} and "
            f"{_where(spec)}): names must be unique across the project."
        )
    _registered[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a capability (tests that register their own), and its cached schemas."""
    _registered.pop(name, None)
    _schema_with_limits.cache_clear()
    _validator.cache_clear()


def _where(spec: CapabilitySpec) -> str:
    runner = spec.runner
    if isinstance(runner, str):
        return runner
    return f"{getattr(runner, '__module__', '?')}.{getattr(runner, '__qualname__', '?')}"


def all_specs() -> tuple[CapabilitySpec, ...]:
    """Every capability agents may call, the built-ins first."""
    return tuple(_registered.values())


def autodiscover() -> None:
    """Import every installed app's `abp_capabilities` module (app start), built-ins first."""
    import_module(BUILT_INS)
    autodiscover_modules("abp_capabilities")


def get(name: str) -> CapabilitySpec | None:
    """The spec of a capability, or None."""
    return _registered.get(name)


def require(name: str) -> CapabilitySpec:
    """The spec of a capability; LookupError if there is none."""
    spec = _registered.get(name)
    if spec is None:
        raise LookupError(f"No capability {name!r} is registered.")
    return spec
