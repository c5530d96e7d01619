"""The `process.image` parameters as typed values, and the image's bytes.

The input schema (`spec`) checked the parameters before the job was queued; they are
read here, not checked again. What it cannot check is checked where it is known: the
content's base64 and decoded size here, the image's size after each operation in
`geometry`. An image sent as an upload reference arrives as bytes (the worker read it
from storage: capabilities/jobs/inputs.py), or as the error to raise for a reference
the call may not use.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.protocol.errors import ErrorCode
from capabilities.protocol.fields import Fields
from capabilities.work.context import CapabilityError
from capabilities.work.images.spec import (
    DEFAULT_FIT,
    DEFAULT_SHARPEN_PERCENT,
    DEFAULT_SHARPEN_RADIUS,
    DEFAULT_SHARPEN_THRESHOLD,
    Fit,
    FlipDirection,
    ImageFormat,
    OperationType,
)
from capabilities.work.raster import Limits

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
    """The call's parameters, as typed values."""

    content: str | bytes  # base64 text, or the bytes of an upload
    operations: tuple[Operation, ...]
    format: ImageFormat | None
    quality: int | None


def _invalid(path: str, message: str, **details: Any) -> CapabilityError:
    return CapabilityError(ErrorCode.INVALID_PARAMS, message, details={"path": path, **details})


def parse(params: dict[str, Any]) -> Request:
    """The parameters, valid by the input schema, as typed values."""
    fields = Fields(params, "params")
    return Request(
        content=_content(fields.object("image")),
        operations=tuple(_operation(item) for item in fields.objects("operations")),
        format=fields.optional_choice("format", ImageFormat),
        quality=fields.optional_integer("quality"),
    )


def _content(image: Fields) -> str | bytes:
    """The image's base64 text, or its bytes when it came as an upload."""
    content = image.get("content")
    if isinstance(content, CapabilityError):  # a reference this call may not use
        raise content
    if isinstance(content, bytes):
        return content
    return image.string("content")


def _operation(fields: Fields) -> Operation:
    match fields.choice("type", OperationType):
        case OperationType.RESIZE:
            return Resize(
                width=fields.optional_integer("width"),
                height=fields.optional_integer("height"),
                fit=fields.choice("fit", Fit, DEFAULT_FIT),
            )
        case OperationType.THUMBNAIL:
            return Thumbnail(width=fields.integer("width"), height=fields.integer("height"))
        case OperationType.CROP:
            return Crop(
                left=fields.integer("left"),
                top=fields.integer("top"),
                width=fields.integer("width"),
                height=fields.integer("height"),
            )
        case OperationType.ROTATE:
            return Rotate(degrees=fields.number("degrees"), expand=fields.boolean("expand", True))
        case OperationType.FLIP:
            return Flip(direction=fields.choice("direction", FlipDirection))
        case OperationType.BLUR:
            return Blur(radius=fields.number("radius"))
        case OperationType.SHARPEN:
            return Sharpen(
                radius=fields.number("radius", DEFAULT_SHARPEN_RADIUS),
                percent=fields.integer("percent", DEFAULT_SHARPEN_PERCENT),
                threshold=fields.integer("threshold", DEFAULT_SHARPEN_THRESHOLD),
            )
        case OperationType.GRAYSCALE:
            return Grayscale()
        case OperationType.COMPRESS:
            return Compress(quality=fields.integer("quality"))
        case OperationType.CONVERT:
            return Convert(format=fields.choice("format", ImageFormat))


def _image_bytes(content: str | bytes, limits: Limits) -> bytes:
    """The image's bytes: an upload's as they are, base64 decoded strictly (line
    breaks, MIME style, are forgiven).

    The schema bounds the text's length; only decoding tells the bytes' exact count.
    """
    if isinstance(content, bytes):
        return _within(content, limits)
    if content.startswith("data:"):
        message = "'params.image.content' must be plain base64, not a data: URL."
        raise _invalid(_CONTENT, message)
    data = _b64decode(content)
    if data is None:
        compact = "".join(content.split())
        data = _b64decode(compact) if compact != content else None
    if data is None:
        raise _invalid(_CONTENT, "'params.image.content' is not valid base64.")
    return _within(data, limits)


def _within(data: bytes, limits: Limits) -> bytes:
    limit = limits.input_bytes
    if len(data) > limit:
        raise _invalid(_CONTENT, f"The image is larger than {limit} bytes.", limit=limit)
    return data


def _b64decode(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        return None
