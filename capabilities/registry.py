"""The one list of what agents may call: names, JSON Schemas, runners.

`initialize-result.capabilities`, the manifest and param validation all read it.
Runners are dotted paths imported only where they run (the worker), so the web
process never loads WeasyPrint or Pillow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import import_module
from typing import Any, cast

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from capabilities.context import Runner
from capabilities.protocol import ErrorCode, WireError

# Dotted paths of the product's CapabilitySpec objects.
PRODUCT_CAPABILITY_SPECS = (
    "capabilities.pdf_spec.SPEC",
    "capabilities.images_spec.SPEC",
    "capabilities.markdown_spec.SPEC",
)


@dataclass(frozen=True, kw_only=True)
class CapabilitySpec:
    """A capability as agents see it, plus where its runner lives."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    runner: str
    # Optional: a function the worker calls once before forking (imports, caches).
    warm_up: str | None = None

    def describe(self) -> dict[str, Any]:
        """The manifest entry."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "outputSchema": self.output_schema,
        }

    def validate(self, params: dict[str, Any]) -> WireError | None:
        """Check params against the input schema; the first problem, coded, or None."""
        validator = _validator(self.name)
        if validator.is_valid(params):  # the common case: skip collecting errors
            return None
        error = _best_error(validator, params)
        return None if error is None else _wire_error(error)

    def load_runner(self) -> Runner:
        """Import the runner (in the worker)."""
        return cast(Runner, import_string(self.runner))

    def prepare(self) -> None:
        """Import the runner and run its warm-up, if any (worker start)."""
        self.load_runner()
        if self.warm_up is not None:
            import_string(self.warm_up)()


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    # Keyed by name: specs are immutable and loaded once per process.
    spec = get(name)
    if spec is None:
        raise LookupError(name)
    return Draft202012Validator(spec.input_schema)


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


@functools.cache
def all_specs() -> tuple[CapabilitySpec, ...]:
    """Every capability agents may call, product ones first."""
    paths = (*PRODUCT_CAPABILITY_SPECS, *settings.ABP["EXTRA_CAPABILITIES"])
    specs = tuple(cast(CapabilitySpec, _import_attr(path)) for path in paths)
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"Duplicate capability names: {names}")
    return specs


def _import_attr(path: str) -> object:
    module_name, _, attr = path.rpartition(".")
    return getattr(import_module(module_name), attr)


def get(name: str) -> CapabilitySpec | None:
    """The spec of a capability, or None."""
    return next((spec for spec in all_specs() if spec.name == name), None)
