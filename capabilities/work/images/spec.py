"""The process.image capability as agents see it: description, JSON Schemas, limits.

Kept apart from the runner (`capabilities.work.images.runner`), so the web process, which reads
the schemas, never loads Pillow. The manifest's schema also carries the server's byte
and side limits (`abp_settings().MAX_IMAGE_BYTES`, `["MAX_IMAGE_DIMENSION"]`); the
limits on the decoded image, which no schema can check, are the runner's. Declared in
capabilities/abp_capabilities.py.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from capabilities.work.registry import SettingMaximum, SizeLimit
from capabilities.work.schemas import binary_input, binary_result


class ImageFormat(StrEnum):
    """An image format accepted as input and written as output."""

    JPEG = "jpeg"
    PNG = "png"
    WEBP = "webp"
    GIF = "gif"
    TIFF = "tiff"

    @property
    def mime_type(self) -> str:
        """The format's MIME type."""
        return f"image/{self.value}"

    @property
    def extension(self) -> str:
        """The file name extension of the output."""
        return "jpg" if self is ImageFormat.JPEG else self.value


class OperationType(StrEnum):
    """What an operation does (its `type`)."""

    RESIZE = "resize"
    THUMBNAIL = "thumbnail"
    CROP = "crop"
    ROTATE = "rotate"
    FLIP = "flip"
    BLUR = "blur"
    SHARPEN = "sharpen"
    GRAYSCALE = "grayscale"
    COMPRESS = "compress"
    CONVERT = "convert"


class Fit(StrEnum):
    """How a resize to both a width and a height treats the aspect ratio."""

    COVER = "cover"
    """Keep the aspect ratio, fill the box, crop what overflows (centred)."""
    CONTAIN = "contain"
    """Keep the aspect ratio, fit in the box, pad to the box (centred)."""
    FILL = "fill"
    """Stretch to the box."""
    INSIDE = "inside"
    """Keep the aspect ratio, as large as fits in the box; no padding."""


class FlipDirection(StrEnum):
    """Which way a flip mirrors the image."""

    HORIZONTAL = "horizontal"
    """Left and right swap."""
    VERTICAL = "vertical"
    """Top and bottom swap."""


# Fixed schema limits. A side is also at most settings.ABP's MAX_IMAGE_DIMENSION (see
# SETTING_MAXIMA); the runner applies it, and MAX_IMAGE_PIXELS, to the input, every intermediate
# image and the output.
SCHEMA_MAX_DIMENSION = 16384
MAX_OPERATIONS = 100
MAX_FILTER_RADIUS = 100
MAX_SHARPEN_PERCENT = 1000
DEFAULT_QUALITY = 80
DEFAULT_FIT = Fit.COVER
# Pillow's UnsharpMask defaults.
DEFAULT_SHARPEN_RADIUS = 2.0
DEFAULT_SHARPEN_PERCENT = 150
DEFAULT_SHARPEN_THRESHOLD = 3
DEFAULT_FILENAME_STEM = "image"

DESCRIPTION = (
    "Transform an image (JPEG, PNG, WebP, GIF (first frame) or TIFF, sent as base64 or "
    "as an upload's reference): "
    "resize, thumbnail, crop, rotate, flip, blur, sharpen, grayscale, then encode it as "
    "JPEG, PNG, WebP, GIF or TIFF. The EXIF orientation is applied first; operations run "
    "in order. Metadata other than the colour profile is dropped. Reports progress per "
    "operation; cancellable."
)

_DIMENSION: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": SCHEMA_MAX_DIMENSION}
_OFFSET: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": SCHEMA_MAX_DIMENSION}
_QUALITY: dict[str, Any] = {
    "type": "integer",
    "minimum": 1,
    "maximum": 100,
    "description": "Encoder quality for JPEG and WebP (1-100); lossless formats ignore it.",
}
_FORMAT: dict[str, Any] = {"enum": [f.value for f in ImageFormat]}
_FORMATS_TEXT = ", ".join(f.value for f in ImageFormat)


def _operation(
    type_: OperationType,
    description: str,
    properties: dict[str, Any] | None = None,
    required: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "title": type_.value,
        "description": description,
        "type": "object",
        "properties": {"type": {"const": type_.value}, **(properties or {})},
        "required": ["type", *required],
        "additionalProperties": False,
        **(extra or {}),
    }


OPERATIONS: list[dict[str, Any]] = [
    _operation(
        OperationType.RESIZE,
        "Resize to a width, a height, or both (then `fit` decides). With one of them "
        "the aspect ratio is kept.",
        {
            "width": _DIMENSION,
            "height": _DIMENSION,
            "fit": {
                "enum": [f.value for f in Fit],
                "default": DEFAULT_FIT.value,
                "description": "cover: fill the box and crop the overflow; contain: fit "
                "and pad (transparent, or white without alpha); fill: stretch; inside: "
                "fit, no padding.",
            },
        },
        # At least one of width and height, written so that the error names `height`.
        extra={"if": {"not": {"required": ["width"]}}, "then": {"required": ["height"]}},
    ),
    _operation(
        OperationType.THUMBNAIL,
        "Shrink to fit in width x height, keeping the aspect ratio; never enlarges.",
        {"width": _DIMENSION, "height": _DIMENSION},
        ("width", "height"),
    ),
    _operation(
        OperationType.CROP,
        "Keep the rectangle at (left, top) of width x height; it must lie in the image.",
        {"left": _OFFSET, "top": _OFFSET, "width": _DIMENSION, "height": _DIMENSION},
        ("left", "top", "width", "height"),
    ),
    _operation(
        OperationType.ROTATE,
        "Rotate clockwise by `degrees`. Uncovered corners are transparent, or white without alpha.",
        {
            "degrees": {"type": "number", "minimum": -360, "maximum": 360},
            "expand": {
                "type": "boolean",
                "default": True,
                "description": "Grow the image to hold the whole rotated picture; "
                "false keeps the size and clips.",
            },
        },
        ("degrees",),
    ),
    _operation(
        OperationType.FLIP,
        "Mirror the image: horizontal swaps left and right, vertical top and bottom.",
        {"direction": {"enum": [d.value for d in FlipDirection]}},
        ("direction",),
    ),
    _operation(
        OperationType.BLUR,
        "Gaussian blur of the given radius (pixels); 0 changes nothing.",
        {"radius": {"type": "number", "minimum": 0, "maximum": MAX_FILTER_RADIUS}},
        ("radius",),
    ),
    _operation(
        OperationType.SHARPEN,
        "Unsharp mask: radius (pixels) of the blur, percent of strength, threshold "
        "(0-255) below which differences are left alone.",
        {
            "radius": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_FILTER_RADIUS,
                "default": DEFAULT_SHARPEN_RADIUS,
            },
            "percent": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_SHARPEN_PERCENT,
                "default": DEFAULT_SHARPEN_PERCENT,
            },
            "threshold": {
                "type": "integer",
                "minimum": 0,
                "maximum": 255,
                "default": DEFAULT_SHARPEN_THRESHOLD,
            },
        },
    ),
    _operation(OperationType.GRAYSCALE, "Convert to grayscale (keeps transparency)."),
    _operation(
        OperationType.COMPRESS,
        "Set the output quality (JPEG, WebP); a later compress or `quality` wins.",
        {"quality": _QUALITY},
        ("quality",),
    ),
    _operation(
        OperationType.CONVERT,
        "Set the output format; the last convert wins over `format`.",
        {"format": _FORMAT},
        ("format",),
    ),
]

INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "image": binary_input(
            "The input image: BinaryData, base64-encoded (plain base64, not a data: URL; "
            "output BinaryData may be passed back as is), or the reference an upload "
            "returned (`{uploadId}`, docs/uploads.md: raw bytes, no base64).",
            content_description="Informative: the format is read from the content.",
        ),
        "operations": {
            "type": "array",
            "maxItems": MAX_OPERATIONS,
            "default": [],
            "description": "Applied in order, after the EXIF orientation.",
            "items": {"oneOf": OPERATIONS},
        },
        "format": {
            **_FORMAT,
            "description": f"Output format ({_FORMATS_TEXT}). Default: the input's format.",
        },
        "quality": {**_QUALITY, "default": DEFAULT_QUALITY},
    },
    "required": ["image"],
    "additionalProperties": False,
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "image": binary_result({"enum": [f.mime_type for f in ImageFormat]}, "an image"),
        "width": {"type": "integer", "minimum": 1},
        "height": {"type": "integer", "minimum": 1},
    },
    "required": ["image", "width", "height"],
}


SIZE_LIMITS = (SizeLimit(path=("image", "content"), setting="MAX_IMAGE_BYTES", base64=True),)
# A side or offset past the server's side limit is refused before queueing: a resize
# or crop there could only fail later, in the worker.
SETTING_MAXIMA = (
    SettingMaximum(
        nodes=tuple(
            ("properties", "operations", "items", "oneOf", index, "properties", name)
            for index, variant in enumerate(OPERATIONS)
            for name in variant["properties"]
            if name in ("width", "height", "left", "top")
        ),
        setting="MAX_IMAGE_DIMENSION",
    ),
)
