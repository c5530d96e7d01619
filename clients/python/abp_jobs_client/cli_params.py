"""The CLI's `--param name=value` arguments, read against the capability's input schema."""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any

from abp_jobs_client.messages import Blob


class ParamError(ValueError):
    """A `--param` the CLI cannot read."""


def parse(arguments: list[str], input_schema: dict[str, Any]) -> dict[str, Any]:
    """The call's params.

    `name=@path` reads a file: as bytes for a binary input (the schema takes an
    upload), as text otherwise. `name=value` is JSON when it parses (`[...]`, `5`,
    `true`), else the string itself.
    """
    properties = input_schema.get("properties") or {}
    params: dict[str, Any] = {}
    for argument in arguments:
        name, equals, value = argument.partition("=")
        if not equals or not name:
            raise ParamError(f"--param {argument!r}: expected name=value or name=@file")
        binary = is_binary(properties.get(name) or {})
        params[name] = _file(name, value[1:], binary) if value.startswith("@") else _value(value)
    return params


def is_binary(schema: dict[str, Any]) -> bool:
    """Whether a property takes BinaryData (inline base64, or an upload's reference)."""
    return "uploadId" in json.dumps(schema)


def _file(name: str, path: str, binary: bool) -> Any:
    try:
        if binary:
            mime_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
            return Blob(Path(path).read_bytes(), mime_type, Path(path).name)
        return Path(path).read_text()
    except OSError as failed:
        raise ParamError(f"--param {name}=@{path}: {failed.strerror or failed}") from None


def _value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value
