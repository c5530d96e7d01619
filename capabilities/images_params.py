"""The `process.image` parameters: checked and typed, and the image's bytes from base64.

Pillow is imported only inside `Limits.from_settings`, which reads its pixel limit.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, get_args

from django.conf import settings

from capabilities.context import CapabilityError
from capabilities.images_spec import (
    DEFAULT_FIT,
    DEFAULT_SHARPEN_PERCENT,
    DEFAULT_SHARPEN_RADIUS,
    DEFAULT_SHARPEN_THRESHOLD,
    MAX_FILTER_RADIUS,
    MAX_OPERATIONS,
    MAX_SHARPEN_PERCENT,
    Fit,
    FlipDirection,
    ImageFormat,
    OperationType,
)
from capabilities.protocol.errors import ErrorCode

_CONTENT = "params.image.content"


@dataclass(frozen=True, kw_only=True)
class Resize:
    """Resize to a width, a height or both; `fit` applies when both are given."""

    kind: ClassVar[OperationType] = OperationType.RESIZE

    width: int | None
    height: int | None
    fit: Fit


@dataclass(frozen=True, kw_only=True)
class Thumbnail:
    """Shrink into width x height, keeping the aspect ratio; never enlarge."""

    kind: ClassVar[OperationType] = OperationType.THUMBNAIL

    width: int
    height: int


@dataclass(frozen=True, kw_only=True)
class Crop:
    """Keep a rectangle that lies in the image."""

    kind: ClassVar[OperationType] = OperationType.CROP

    left: int
    top: int
    width: int
    height: int


@dataclass(frozen=True, kw_only=True)
class Rotate:
    """Rotate clockwise."""

    kind: ClassVar[OperationType] = OperationType.ROTATE

    degrees: float
    expand: bool


@dataclass(frozen=True, kw_only=True)
class Flip:
    """Mirror the image."""

    kind: ClassVar[OperationType] = OperationType.FLIP

    direction: FlipDirection


@dataclass(frozen=True, kw_only=True)
class Blur:
    """Gaussian blur."""

    kind: ClassVar[OperationType] = OperationType.BLUR

    radius: float


@dataclass(frozen=True, kw_only=True)
class Sharpen:
    """Unsharp mask."""

    kind: ClassVar[OperationType] = OperationType.SHARPEN

    radius: float
    percent: int
    threshold: int


@dataclass(frozen=True, kw_only=True)
class Grayscale:
    """Convert to grayscale, keeping transparency."""

    kind: ClassVar[OperationType] = OperationType.GRAYSCALE


@dataclass(frozen=True, kw_only=True)
class Compress:
    """Set the output quality."""

    kind: ClassVar[OperationType] = OperationType.COMPRESS

    quality: int


@dataclass(frozen=True, kw_only=True)
class Convert:
    """Set the output format."""

    kind: ClassVar[OperationType] = OperationType.CONVERT

    format: ImageFormat


Operation = (
    Resize | Thumbnail | Crop | Rotate | Flip | Blur | Sharpen | Grayscale | Compress | Convert
)


@dataclass(frozen=True, kw_only=True)
class Request:
    """The call's parameters, checked and typed."""

    content: str
    operations: tuple[Operation, ...]
    format: ImageFormat | None
    quality: int | None


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The server's limits (settings.ABP), read once per call."""

    input_bytes: int
    pixels: int
    dimension: int
    output_bytes: int

    @classmethod
    def from_settings(cls) -> Limits:
        from PIL import Image

        abp = settings.ABP
        # Pillow refuses more than its own MAX_IMAGE_PIXELS (with a warning we make an
        # error) in open() and crop(): past it, our clearer refusal comes first.
        pillow = Image.MAX_IMAGE_PIXELS
        pixels: int = abp["MAX_IMAGE_PIXELS"]
        return cls(
            input_bytes=abp["MAX_IMAGE_BYTES"],
            pixels=pixels if pillow is None else min(pixels, pillow),
            dimension=abp["MAX_IMAGE_DIMENSION"],
            output_bytes=abp["MAX_IMAGE_OUTPUT_BYTES"],
        )


def _error(code: ErrorCode, path: str, message: str, **details: Any) -> CapabilityError:
    return CapabilityError(code, message, details={"path": path, **details})


def _invalid(path: str, message: str, **details: Any) -> CapabilityError:
    return _error(ErrorCode.INVALID_PARAMS, path, message, **details)


_E = TypeVar("_E", ImageFormat, Fit, FlipDirection)
_ABSENT = object()


class _Fields:
    """Typed reads of one JSON object's fields; each refusal names the field's path."""

    def __init__(self, value: object, path: str, allowed: Collection[str]) -> None:
        if not isinstance(value, dict):
            raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be an object.")
        unknown = sorted(str(key) for key in value if key not in allowed)
        if unknown:
            raise _invalid(f"{path}.{unknown[0]}", f"Unknown parameter '{path}.{unknown[0]}'.")
        self._values: dict[str, object] = value
        self._path = path

    def path(self, name: str) -> str:
        return f"{self._path}.{name}"

    def missing(self, name: str) -> CapabilityError:
        path = self.path(name)
        return _error(ErrorCode.MISSING_PARAM, path, f"Missing parameter '{path}'.")

    def raw(self, name: str) -> object:
        """The value, or _ABSENT."""
        return self._values.get(name, _ABSENT)

    def integer(self, name: str, low: int, high: int, default: int | None = None) -> int:
        value = self.optional_integer(name, low, high)
        if value is not None:
            return value
        if default is not None:
            return default
        raise self.missing(name)

    def optional_integer(self, name: str, low: int, high: int) -> int | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        path = self.path(name)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be an integer.")
        if not low <= value <= high:
            raise _invalid(path, f"'{path}' must be from {low} to {high}.")
        return value

    def number(self, name: str, low: float, high: float, default: float | None = None) -> float:
        value = self.raw(name)
        if value is _ABSENT:
            if default is None:
                raise self.missing(name)
            return default
        path = self.path(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be a number.")
        if not low <= value <= high:  # also refuses NaN
            raise _invalid(path, f"'{path}' must be from {low:g} to {high:g}.")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is _ABSENT:
            return default
        if not isinstance(value, bool):
            path = self.path(name)
            raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be a boolean.")
        return value

    def string(self, name: str) -> str | None:
        value = self.raw(name)
        if value is _ABSENT:
            return None
        if not isinstance(value, str):
            path = self.path(name)
            raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be a string.")
        return value

    def choice(self, name: str, kind: type[_E], default: _E | None = None) -> _E:
        value = self.optional_choice(name, kind)
        if value is not None:
            return value
        if default is not None:
            return default
        raise self.missing(name)

    def optional_choice(self, name: str, kind: type[_E]) -> _E | None:
        value = self.string(name)
        if value is None:
            return None
        try:
            return kind(value)
        except ValueError:
            path = self.path(name)
            choices = ", ".join(member.value for member in kind)
            raise _invalid(path, f"'{path}' must be one of: {choices}.") from None


# Each operation's parameters besides `type`: its dataclass fields.
_OPERATION_FIELDS: dict[OperationType, frozenset[str]] = {
    cls.kind: frozenset(field.name for field in dataclasses.fields(cls))
    for cls in get_args(Operation)
}


def parse(params: dict[str, Any], limits: Limits) -> Request:
    """The parameters, checked and typed, or a CapabilityError naming the bad one."""
    fields = _Fields(params, "params", ("image", "operations", "format", "quality"))
    if fields.raw("image") is _ABSENT:
        raise fields.missing("image")
    image = _Fields(
        fields.raw("image"), "params.image", ("content", "mimeType", "encoding", "size", "filename")
    )
    content = image.string("content")
    if content is None:
        raise image.missing("content")
    if image.string("encoding") not in (None, "base64"):
        raise _invalid("params.image.encoding", "'params.image.encoding' must be 'base64'.")
    # Informative only (the format is read from the content, the size counted), but typed.
    image.string("mimeType")
    image.string("filename")
    image.optional_integer("size", 0, 2**63)
    operations = fields.raw("operations")
    if operations is _ABSENT:
        operations = []
    if not isinstance(operations, list):
        path = "params.operations"
        raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be an array.")
    if len(operations) > MAX_OPERATIONS:
        raise _invalid("params.operations", f"At most {MAX_OPERATIONS} operations.")
    return Request(
        content=content,
        operations=tuple(
            _operation(value, f"params.operations[{index}]", limits)
            for index, value in enumerate(operations)
        ),
        format=fields.optional_choice("format", ImageFormat),
        quality=fields.optional_integer("quality", 1, 100),
    )


def _operation(value: object, path: str, limits: Limits) -> Operation:
    if not isinstance(value, dict):
        raise _error(ErrorCode.INVALID_TYPE, path, f"'{path}' must be an object.")
    if "type" not in value:
        raise _error(ErrorCode.MISSING_PARAM, f"{path}.type", f"Missing parameter '{path}.type'.")
    try:
        type_ = OperationType(value["type"])
    except ValueError:
        names = ", ".join(t.value for t in OperationType)
        raise _invalid(f"{path}.type", f"'{path}.type' must be one of: {names}.") from None
    fields = _Fields(value, path, _OPERATION_FIELDS[type_] | {"type"})
    side = limits.dimension
    match type_:
        case OperationType.RESIZE:
            width = fields.optional_integer("width", 1, side)
            height = fields.optional_integer("height", 1, side)
            if width is None and height is None:
                raise _error(
                    ErrorCode.MISSING_PARAM, path, f"'{path}' needs a width, a height or both."
                )
            fit = fields.choice("fit", Fit, DEFAULT_FIT)
            return Resize(width=width, height=height, fit=fit)
        case OperationType.THUMBNAIL:
            return Thumbnail(
                width=fields.integer("width", 1, side), height=fields.integer("height", 1, side)
            )
        case OperationType.CROP:
            return Crop(
                left=fields.integer("left", 0, side),
                top=fields.integer("top", 0, side),
                width=fields.integer("width", 1, side),
                height=fields.integer("height", 1, side),
            )
        case OperationType.ROTATE:
            degrees = fields.number("degrees", -360, 360)
            return Rotate(degrees=degrees, expand=fields.boolean("expand", True))
        case OperationType.FLIP:
            return Flip(direction=fields.choice("direction", FlipDirection))
        case OperationType.BLUR:
            return Blur(radius=fields.number("radius", 0, MAX_FILTER_RADIUS))
        case OperationType.SHARPEN:
            return Sharpen(
                radius=fields.number("radius", 0, MAX_FILTER_RADIUS, DEFAULT_SHARPEN_RADIUS),
                percent=fields.integer("percent", 0, MAX_SHARPEN_PERCENT, DEFAULT_SHARPEN_PERCENT),
                threshold=fields.integer("threshold", 0, 255, DEFAULT_SHARPEN_THRESHOLD),
            )
        case OperationType.GRAYSCALE:
            return Grayscale()
        case OperationType.COMPRESS:
            return Compress(quality=fields.integer("quality", 1, 100))
        case OperationType.CONVERT:
            return Convert(format=fields.choice("format", ImageFormat))


def _image_bytes(content: str, limits: Limits) -> bytes:
    """The decoded base64 content: strict, but line breaks (MIME style) are forgiven."""
    limit = limits.input_bytes
    too_large = _invalid(_CONTENT, f"The image is larger than {limit} bytes.", limit=limit)
    # A far too long text is refused without decoding it (4 characters per 3 bytes).
    if len(content) > 2 * 4 * (limit // 3 + 1) + 1024:
        raise too_large
    if content.startswith("data:"):
        message = "'params.image.content' must be plain base64, not a data: URL."
        raise _invalid(_CONTENT, message)
    data = _b64decode(content)
    if data is None:
        compact = "".join(content.split())
        data = _b64decode(compact) if compact != content else None
    if data is None:
        raise _invalid(_CONTENT, "'params.image.content' is not valid base64.")
    if len(data) > limit:
        raise too_large
    return data


def _b64decode(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        return None
