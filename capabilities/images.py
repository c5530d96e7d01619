"""The `process.image` runner: an image in, operations in order, an image out, by Pillow.

Nothing is decoded before it is known to fit: the header's size and the size after
every operation are checked against the limits first (`plan`). A JPEG whose first
geometric operation shrinks it is decoded at 1/2, 1/4 or 1/8 scale (`fast_downscale`
is that recipe alone). Checkpoints: every block the decoder reads or the encoder
writes, between operations, and between the bands of a large blur or sharpen.
Only workers import this module (the schemas live in `images_spec`).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import struct
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, get_args

from django.conf import settings
from PIL import (
    ExifTags,
    Image,
    ImageFile,
    ImageFilter,
    ImageOps,
    JpegImagePlugin,
    UnidentifiedImageError,
)

from capabilities.context import CapabilityError, JobContext
from capabilities.images_spec import (
    DEFAULT_FILENAME_STEM,
    DEFAULT_FIT,
    DEFAULT_QUALITY,
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

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

Size = tuple[int, int]
Box = tuple[float, float, float, float]
Checkpoint = Callable[[], None]

# Pillow's names of the formats we open; an MPO (a camera's multi-picture JPEG) comes
# in through the JPEG opener and is read as its first picture.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "TIFF")
_INPUT_FORMATS = {name: ImageFormat(name.lower()) for name in ALLOWED_FORMATS}
_INPUT_FORMATS["MPO"] = ImageFormat.JPEG
_FORMATS_TEXT = "JPEG, PNG, WebP, GIF or TIFF"
# Largest side each encoder can write; PNG and TIFF have no limit that matters here.
_ENCODER_MAX_SIDE = {ImageFormat.JPEG: 65_500, ImageFormat.WEBP: 16_383, ImageFormat.GIF: 65_535}
# Resizes first shrink by whole factors (fast) while over this many times the target;
# from 3.0 on, Pillow's docs say, that is indistinguishable from fair resampling.
REDUCING_GAP = 3.0
# A blur or sharpen of a larger image runs in bands of about this many pixels.
_BAND_PIXELS = 4_000_000
_CONTENT = "params.image.content"


# --- Parameters --------------------------------------------------------------------


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


# --- Geometry: the size after each operation, known before any pixel is decoded -----


@dataclass(frozen=True)
class _Scaling:
    """Where a resize takes its pixels from and where it puts them."""

    region: Box  # the part of the picture resampled, in the picture's pixels
    scaled: Size  # what that part is resampled to
    canvas: Size  # the output: `scaled`, padded to this size (contain), centred
    whole: Size  # the whole picture at the same scale: what a JPEG draft aims at


def _fit_inside(size: Size, box: Size) -> Size:
    """The largest size with `size`'s aspect ratio inside `box` (Image.thumbnail's rounding)."""
    width, height = size
    x, y = box
    aspect = width / height

    def round_aspect(number: float, key: Callable[[int], float]) -> int:
        return max(min(math.floor(number), math.ceil(number), key=key), 1)

    if x / y >= aspect:
        return round_aspect(y * aspect, key=lambda n: abs(aspect - n / y)), y
    return x, round_aspect(x / aspect, key=lambda n: 0 if n == 0 else abs(aspect - x / n))


def _scaling(operation: Resize | Thumbnail, size: Size) -> _Scaling:
    width, height = size
    whole: Box = (0.0, 0.0, float(width), float(height))
    if isinstance(operation, Thumbnail):
        box = (operation.width, operation.height)
        target = size if box[0] >= width and box[1] >= height else _fit_inside(size, box)
        return _Scaling(whole, target, target, target)
    w, h, fit = operation.width, operation.height, operation.fit
    if w is None or h is None:
        # The other side keeps the aspect ratio, rounded half up.
        if w is None:
            assert h is not None
            w = max(1, math.floor(width * h / height + 0.5))
        else:
            h = max(1, math.floor(height * w / width + 0.5))
        return _Scaling(whole, (w, h), (w, h), (w, h))
    if fit is Fit.FILL:
        return _Scaling(whole, (w, h), (w, h), (w, h))
    if fit in (Fit.INSIDE, Fit.CONTAIN):
        inner = _fit_inside(size, (w, h))
        return _Scaling(whole, inner, (w, h) if fit is Fit.CONTAIN else inner, inner)
    scale = max(w / width, h / height)
    crop_width, crop_height = w / scale, h / scale
    left, top = (width - crop_width) / 2, (height - crop_height) / 2
    region = (left, top, left + crop_width, top + crop_height)
    return _Scaling(region, (w, h), (w, h), (math.ceil(width * scale), math.ceil(height * scale)))


def _rotated_size(size: Size, degrees: float, expand: bool) -> Size:
    """The size Image.rotate(-degrees, expand=expand) gives, by Pillow's own arithmetic."""
    width, height = size
    angle = -degrees % 360.0
    if not expand:
        return size
    if angle % 90 == 0:
        return size if angle % 180 == 0 else (height, width)
    radians = -math.radians(angle)
    a, b = round(math.cos(radians), 15), round(math.sin(radians), 15)
    d, e = -b, a
    center_x, center_y = width / 2, height / 2
    c = a * -center_x + b * -center_y + center_x
    f = d * -center_x + e * -center_y + center_y
    corners = ((0, 0), (width, 0), (width, height), (0, height))
    xs = [a * x + b * y + c for x, y in corners]
    ys = [d * x + e * y + f for x, y in corners]
    return (
        math.ceil(max(xs)) - math.floor(min(xs)),
        math.ceil(max(ys)) - math.floor(min(ys)),
    )


def _size_after(operation: Operation, size: Size, path: str) -> Size:
    match operation:
        case Resize() | Thumbnail():
            return _scaling(operation, size).canvas
        case Crop(left=left, top=top, width=width, height=height):
            if left + width > size[0] or top + height > size[1]:
                message = (
                    f"The crop {width}x{height} at ({left}, {top}) does not lie in the "
                    f"{size[0]}x{size[1]} image."
                )
                raise _invalid(path, message)
            return width, height
        case Rotate(degrees=degrees, expand=expand):
            return _rotated_size(size, degrees, expand)
        case _:
            return size


def _check_size(size: Size, limits: Limits, path: str) -> None:
    width, height = size
    if max(width, height) > limits.dimension or width * height > limits.pixels:
        message = (
            f"A {width}x{height} image is over the limits: sides of {limits.dimension} "
            f"pixels, {limits.pixels} pixels in all."
        )
        raise _invalid(path, message, limit=limits.pixels, dimensionLimit=limits.dimension)


def plan(operations: tuple[Operation, ...], size: Size, limits: Limits) -> list[Size]:
    """The image's size after each operation; refuses any over the limits, or a bad crop."""
    sizes: list[Size] = []
    for index, operation in enumerate(operations):
        path = f"params.operations[{index}]"
        size = _size_after(operation, size, path)
        _check_size(size, limits, path)
        sizes.append(size)
    return sizes


def _draft_size(operations: tuple[Operation, ...], size: Size) -> Size | None:
    """The size a JPEG may be decoded down to, when the first geometric operation shrinks.

    Grayscale (per pixel), compress and convert (output settings) may come before it.
    """
    for operation in operations:
        if isinstance(operation, Grayscale | Compress | Convert):
            continue
        if isinstance(operation, Resize | Thumbnail):
            whole = _scaling(operation, size).whole
            if whole[0] < size[0] and whole[1] < size[1]:
                return whole
        return None
    return None


# --- Decoding ----------------------------------------------------------------------


class _Source(io.BytesIO):
    """The input bytes; every read (decoders read in blocks) is a checkpoint."""

    def __init__(self, data: bytes, checkpoint: Checkpoint) -> None:
        super().__init__(data)
        self._checkpoint = checkpoint

    def read(self, size: int | None = -1, /) -> bytes:
        self._checkpoint()
        return super().read(size)


@contextmanager
def _decoding(limits: Limits) -> Iterator[None]:
    """Pillow's complaints about the input, as INVALID_PARAMS on the content.

    Truncated input is refused too: WeasyPrint, loaded in the same worker, turns
    Pillow's process-wide LOAD_TRUNCATED_IMAGES on for its own documents, so it is
    held off here while this job decodes (one job at a time per worker process).
    """
    lenient = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    except UnidentifiedImageError:
        message = f"The image is not a {_FORMATS_TEXT} file (or it is damaged)."
        raise _invalid(_CONTENT, message) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        message = f"The image has more than {limits.pixels} pixels."
        raise _invalid(_CONTENT, message, limit=limits.pixels) from None
    except (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError):
        # Truncated or corrupt data, or a metadata chunk over Pillow's own limits.
        raise _invalid(_CONTENT, "The image could not be decoded: damaged or truncated.") from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = lenient


_ORIENTATION = ExifTags.Base.Orientation
_TRANSPOSES = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# Where each transposition sends the point (x, y) of a width x height image.
_MOVES: dict[Image.Transpose, Callable[[float, float, float, float], tuple[float, float]]] = {
    Image.Transpose.FLIP_LEFT_RIGHT: lambda x, y, w, h: (w - x, y),
    Image.Transpose.ROTATE_180: lambda x, y, w, h: (w - x, h - y),
    Image.Transpose.FLIP_TOP_BOTTOM: lambda x, y, w, h: (x, h - y),
    Image.Transpose.TRANSPOSE: lambda x, y, w, h: (y, x),
    Image.Transpose.ROTATE_270: lambda x, y, w, h: (h - y, x),
    Image.Transpose.TRANSVERSE: lambda x, y, w, h: (h - y, w - x),
    Image.Transpose.ROTATE_90: lambda x, y, w, h: (y, w - x),
}


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8), read without decoding the pixels.

    A PNG's eXIf chunk may follow the pixels: that one is only known after decoding.
    """
    if image.format == "PNG" and "exif" not in image.info:
        return 1
    value = image.getexif().get(_ORIENTATION, 1)
    return value if isinstance(value, int) and value in _TRANSPOSES else 1


def _oriented(size: Size, orientation: int) -> Size:
    return (size[1], size[0]) if orientation >= 5 else size


@dataclass(frozen=True)
class _Picture:
    """The decoded image, and where the whole picture lies in it.

    After a JPEG draft, `image` is the picture reduced by 2, 4 or 8 with its size
    rounded up: `box` (in `image`'s pixels) is the picture, `size` its full size.
    Only resize and thumbnail read `box`: a draft is made only when one of them is
    the first operation that moves pixels (`_draft_size`).
    """

    image: Image.Image
    box: Box
    size: Size


def _whole(image: Image.Image) -> _Picture:
    return _Picture(image, (0.0, 0.0, float(image.width), float(image.height)), image.size)


def _open(data: bytes, limits: Limits, checkpoint: Checkpoint) -> ImageFile.ImageFile:
    """Identify the image and check its size; only the header is read."""
    image = Image.open(_Source(data, checkpoint), formats=ALLOWED_FORMATS)
    _check_size(image.size, limits, _CONTENT)
    return image


def _load(image: ImageFile.ImageFile, draft: Size | None) -> _Picture:
    """Decode (a JPEG at a reduced scale when `draft` allows), apply the EXIF orientation."""
    size = _oriented(image.size, _orientation(image))
    drafted: Box | None = None
    if draft is not None and isinstance(image, JpegImagePlugin.JpegImageFile):
        # The draft size is in the stored orientation.
        target = _oriented(draft, _orientation(image))
        result = image.draft("RGB", target)
        drafted = None if result is None else result[1]
    image.load()
    method = _TRANSPOSES.get(_orientation(image))
    stored = image.size
    ImageOps.exif_transpose(image, in_place=True)
    if drafted is None:
        return _normalised(_whole(image))
    if method is not None:
        move = _MOVES[method]
        (x0, y0), (x1, y1) = (move(x, y, *stored) for x, y in (drafted[:2], drafted[2:]))
        drafted = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
    return _normalised(_Picture(image, drafted, size))


_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "F"})


def _normalised(picture: _Picture) -> _Picture:
    """The picture in L, LA, RGB or RGBA, the modes every operation and encoder takes."""
    image = picture.image
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        # 16-bit gray: keep the high byte (a plain convert would clip at 255).
        image = image.point(lambda value: value / 256)
    gray = mode in _GRAY_MODES or mode.startswith("I;16")
    alpha = image.has_transparency_data
    target = ("LA" if alpha else "L") if gray else ("RGBA" if alpha else "RGB")
    if image.mode != target:
        image = image.convert(target)
    return replace(picture, image=image)


def fast_downscale(data: bytes, size: Size) -> Image.Image:
    """`data` (an image file) resized to exactly `size`, after its EXIF orientation.

    The runner's own recipe for a first resize that shrinks: a JPEG is decoded by
    libjpeg at the smallest of 1/8, 1/4, 1/2 or full scale still at least `size`
    (`draft`), then resampled with Lanczos, reducing by whole factors first while
    over `REDUCING_GAP` times the target (`reducing_gap`). Limits from settings.ABP.
    """
    limits = Limits.from_settings()
    _check_size(size, limits, "size")
    with warnings.catch_warnings(), _decoding(limits):
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        picture = _load(_open(data, limits, _no_checkpoint), size)
    stretch = Resize(width=size[0], height=size[1], fit=Fit.FILL)
    return _resample(picture, _scaling(stretch, picture.size))


def _no_checkpoint() -> None:
    pass


# --- Operations --------------------------------------------------------------------


def _background(mode: str) -> tuple[int, ...]:
    """Padding and uncovered corners: transparent, or white when there is no alpha."""
    return {"L": (255,), "LA": (255, 0), "RGB": (255, 255, 255), "RGBA": (255, 255, 255, 0)}[mode]


def _resample(picture: _Picture, scaling: _Scaling) -> Image.Image:
    width, height = picture.size
    x0, y0, x1, y1 = picture.box
    sx, sy = (x1 - x0) / width, (y1 - y0) / height
    left, top, right, bottom = scaling.region
    box = (x0 + left * sx, y0 + top * sy, x0 + right * sx, y0 + bottom * sy)
    image = picture.image.resize(
        scaling.scaled, Image.Resampling.LANCZOS, box=box, reducing_gap=REDUCING_GAP
    )
    if scaling.canvas == scaling.scaled:
        return image
    canvas = Image.new(image.mode, scaling.canvas, _background(image.mode))
    offset = (
        (scaling.canvas[0] - scaling.scaled[0]) // 2,
        (scaling.canvas[1] - scaling.scaled[1]) // 2,
    )
    canvas.paste(image, offset)
    return canvas


def _filter(
    image: Image.Image, kernel: ImageFilter.Filter, radius: float, checkpoint: Checkpoint
) -> Image.Image:
    """`image.filter(kernel)`; a large image in horizontal bands, a checkpoint each.

    Exact: Pillow's Gaussian (also inside UnsharpMask) is three box blurs, each
    reaching at most ceil(radius) pixels, so a band read with 3 * ceil(radius) rows of
    context on each side comes out as the one-shot filter would make it.
    """
    width, height = image.size
    context = 3 * math.ceil(radius) + 2
    rows = max(_BAND_PIXELS // width, 4 * context)
    if rows >= height:
        return image.filter(kernel)
    out = Image.new(image.mode, image.size)
    for top in range(0, height, rows):
        checkpoint()
        bottom = min(top + rows, height)
        above, below = max(0, top - context), min(height, bottom + context)
        band = image.crop((0, above, width, below)).filter(kernel)
        out.paste(band.crop((0, top - above, width, bottom - above)), (0, top))
    return out


def _apply(operation: Operation, picture: _Picture, checkpoint: Checkpoint) -> _Picture:
    image = picture.image
    match operation:
        case Resize() | Thumbnail():
            return _whole(_resample(picture, _scaling(operation, picture.size)))
        case Grayscale():
            # Per pixel: a drafted picture stays drafted.
            return replace(picture, image=image.convert("LA" if "A" in image.mode else "L"))
        case Crop(left=left, top=top, width=width, height=height):
            return _whole(image.crop((left, top, left + width, top + height)))
        case Rotate(degrees=degrees, expand=expand):
            fill = _background(image.mode)
            rotated = image.rotate(
                -degrees, Image.Resampling.BICUBIC, expand=expand, fillcolor=fill
            )
            return _whole(rotated)
        case Flip(direction=direction):
            horizontal = direction is FlipDirection.HORIZONTAL
            method = (
                Image.Transpose.FLIP_LEFT_RIGHT if horizontal else Image.Transpose.FLIP_TOP_BOTTOM
            )
            return _whole(image.transpose(method))
        case Blur(radius=radius):
            blur = ImageFilter.GaussianBlur(radius)
            return _whole(_filter(image, blur, radius, checkpoint))
        case Sharpen(radius=radius, percent=percent, threshold=threshold):
            mask = ImageFilter.UnsharpMask(radius, percent, threshold)
            return _whole(_filter(image, mask, radius, checkpoint))
        case Compress() | Convert():
            return picture


# --- Encoding ----------------------------------------------------------------------


class _OutputTooLarge(Exception):
    """The encoder wrote past the output limit."""


class _Sink(io.BytesIO):
    """The encoder's output; every write is a checkpoint, and the limit is enforced."""

    def __init__(self, limit: int, checkpoint: Checkpoint) -> None:
        super().__init__()
        self._limit = limit
        self._checkpoint = checkpoint

    def write(self, buffer: ReadableBuffer, /) -> int:
        self._checkpoint()
        if self.tell() + memoryview(buffer).nbytes > self._limit:
            raise _OutputTooLarge
        return super().write(buffer)


def _flattened(image: Image.Image) -> Image.Image:
    """`image` without alpha, over white where it was transparent (for JPEG)."""
    if "A" not in image.mode:
        return image
    opaque = image.mode[:-1]
    if image.getchannel("A").getextrema()[0] == 255:
        return image.convert(opaque)
    background = Image.new(image.mode, image.size, (*_background(opaque), 255))
    background.alpha_composite(image)
    return background.convert(opaque)


def _encode(
    image: Image.Image,
    output: _Output,
    profile: bytes | None,
    *,
    limits: Limits,
    checkpoint: Checkpoint,
) -> bytes:
    fmt = output.format
    if fmt is ImageFormat.JPEG:
        image = _flattened(image)
    elif fmt is ImageFormat.GIF and image.mode == "LA":
        image = image.convert("RGBA")  # Pillow's GIF writer drops LA's alpha
    # Only what we pass is written: no EXIF, no leftover palette transparency.
    image.info = {}
    options: dict[str, Any] = {}
    if profile is not None and fmt is not ImageFormat.GIF:
        options["icc_profile"] = profile
    if fmt in (ImageFormat.JPEG, ImageFormat.WEBP):
        options["quality"] = output.quality
    if fmt is ImageFormat.TIFF:
        options["compression"] = "tiff_lzw"
    sink = _Sink(limits.output_bytes, checkpoint)
    try:
        image.save(sink, fmt.name, **options)
    except _OutputTooLarge:
        message = f"The output image would be larger than {limits.output_bytes} bytes."
        raise _invalid("params", message, limit=limits.output_bytes) from None
    return sink.getvalue()


def _profile_family(mode: str) -> str | None:
    """Which colour space an ICC profile of an image of `mode` describes, if one we keep."""
    if mode in _GRAY_MODES or mode.startswith("I;16"):
        return "L"
    if mode in ("RGB", "RGBA", "RGBX", "RGBa", "P", "PA"):
        return "RGB"
    return None  # CMYK, LAB, YCbCr...: converted to RGB, so the profile no longer fits


# --- The runner --------------------------------------------------------------------


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Decode the image, apply the operations in order, save the result through `ctx`."""
    limits = Limits.from_settings()
    request = parse(params, limits)
    data = _image_bytes(request.content, limits)
    operations = request.operations
    total = len(operations)
    ctx.checkpoint()
    ctx.report(progress=0, total=total, stage="decode")
    with warnings.catch_warnings():
        # Pillow only warns between its own limit and twice that.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with _decoding(limits):
            source = _open(data, limits, ctx.checkpoint)
            size = _oriented(source.size, _orientation(source))
        output = _Output.of(request, _INPUT_FORMATS[str(source.format)])
        # Every refusal comes before the pixels are decoded...
        _check_plan(operations, size, output, limits)
        profile, family = source.info.get("icc_profile"), _profile_family(source.mode)
        with _decoding(limits):
            picture = _load(source, _draft_size(operations, size))
        if picture.size != size:
            # ...except when a PNG's orientation comes after its pixels.
            _check_plan(operations, picture.size, output, limits)
        for index, operation in enumerate(operations):
            ctx.checkpoint()
            picture = _apply(operation, picture, ctx.checkpoint)
            ctx.report(progress=index + 1, total=total, stage=operation.kind.value)
        ctx.checkpoint()
        ctx.report(progress=total, total=total, stage="encode")
        image = picture.image
        fits = isinstance(profile, bytes) and _profile_family(image.mode) == family
        content = _encode(
            image, output, profile if fits else None, limits=limits, checkpoint=ctx.checkpoint
        )
    filename = f"{DEFAULT_FILENAME_STEM}.{output.format.extension}"
    saved = ctx.save_file(content, mime_type=output.format.mime_type, filename=filename)
    return {"image": saved, "width": image.width, "height": image.height}


@dataclass(frozen=True)
class _Output:
    """How the result is encoded, and which parameter chose its format."""

    format: ImageFormat
    quality: int
    path: str

    @classmethod
    def of(cls, request: Request, input_format: ImageFormat) -> _Output:
        """`format` and `quality` (or the input's format), then convert and compress in order."""
        quality = request.quality or DEFAULT_QUALITY
        output = cls(request.format or input_format, quality, "params.format")
        for index, operation in enumerate(request.operations):
            if isinstance(operation, Convert):
                output = replace(
                    output, format=operation.format, path=f"params.operations[{index}].format"
                )
            elif isinstance(operation, Compress):
                output = replace(output, quality=operation.quality)
        return output


def _check_plan(
    operations: tuple[Operation, ...], size: Size, output: _Output, limits: Limits
) -> None:
    """Refuse now what would fail later: sizes over the limits, a bad crop, an encoder's limit."""
    final = [size, *plan(operations, size, limits)][-1]
    side = _ENCODER_MAX_SIDE.get(output.format)
    if side is not None and max(final) > side:
        name = output.format.name
        message = f"{name} cannot hold a {final[0]}x{final[1]} image (sides up to {side})."
        raise _invalid(output.path, message, limit=side)


def warm_up() -> None:
    """Decode, resize and encode a tiny image in every format once, before the worker forks.

    Pillow imports most of its plugins on the first open of a WebP or TIFF, and the
    codecs set themselves up on first use; done in the parent, every child shares it.
    """
    tiny = Image.new("RGB", (32, 32), (200, 100, 50))
    for output in ImageFormat:
        buffer = io.BytesIO()
        tiny.save(buffer, output.name)
        picture = _load(Image.open(io.BytesIO(buffer.getvalue()), formats=ALLOWED_FORMATS), (8, 8))
        small = _resample(picture, _scaling(Thumbnail(width=8, height=8), picture.size))
        small.save(io.BytesIO(), output.name)
