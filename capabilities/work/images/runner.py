"""The `process.image` runner: an image in, operations in order, an image out, by Pillow.

Nothing is decoded before it is known to fit: the header's size and the size after
every operation are checked against the limits first (`plan`). A JPEG whose first
geometric operation shrinks it is decoded at 1/2, 1/4 or 1/8 scale (`fast_downscale`
is that recipe alone). Checkpoints: every block the decoder reads or the encoder
writes, between operations, and between the bands of a large blur or sharpen.
Only workers import this module (the schemas live in `spec`); the parameters are
read in `params`, the sizes planned in `geometry`.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from PIL import (
    ExifTags,
    Image,
    ImageFile,
    ImageFilter,
    ImageOps,
    JpegImagePlugin,
    UnidentifiedImageError,
)

# The `name as name` imports are re-exports: the tests reach them through this module.
from capabilities.work.context import JobContext
from capabilities.work.images import heap
from capabilities.work.images.geometry import (
    Box,
    Size,
    _check_size,
    _draft_size,
    _Scaling,
    _scaling,
)
from capabilities.work.images.geometry import plan as plan  # noqa: PLC0414
from capabilities.work.images.params import (
    _CONTENT,
    Blur,
    Compress,
    Convert,
    Crop,
    Flip,
    Grayscale,
    Operation,
    Request,
    Resize,
    Sharpen,
    Thumbnail,
    _image_bytes,
    _invalid,
    parse,
)
from capabilities.work.images.params import Rotate as Rotate  # noqa: PLC0414
from capabilities.work.images.spec import (
    DEFAULT_FILENAME_STEM,
    DEFAULT_QUALITY,
    Fit,
    FlipDirection,
    ImageFormat,
)
from capabilities.work.raster import ALLOWED_FORMATS
from capabilities.work.raster import Limits as Limits  # noqa: PLC0414

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

Checkpoint = Callable[[], None]

# Pillow's names of the formats we open (shared with export.pdf's images); an MPO (a
# camera's multi-picture JPEG) comes in through the JPEG opener, read as its first picture.
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
    request = parse(params)
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
    So does the process's malloc, tuned to keep what a job frees for the next (`heap`).
    """
    heap.keep_freed_memory()
    tiny = Image.new("RGB", (32, 32), (200, 100, 50))
    for output in ImageFormat:
        buffer = io.BytesIO()
        tiny.save(buffer, output.name)
        picture = _load(Image.open(io.BytesIO(buffer.getvalue()), formats=ALLOWED_FORMATS), (8, 8))
        small = _resample(picture, _scaling(Thumbnail(width=8, height=8), picture.size))
        small.save(io.BytesIO(), output.name)
