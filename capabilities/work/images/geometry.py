"""The size after each `process.image` operation, known before any pixel is decoded."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from capabilities.work.images.params import (
    Compress,
    Convert,
    Crop,
    Grayscale,
    Operation,
    Resize,
    Rotate,
    Thumbnail,
    _invalid,
)
from capabilities.work.images.spec import Fit
from capabilities.work.raster import Limits

Size = tuple[int, int]
Box = tuple[float, float, float, float]


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
