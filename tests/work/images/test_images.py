"""The process.image runner, with an in-memory context: no Celery, Redis or DB.

Every input is drawn with Pillow here; every output is decoded with Pillow and checked.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import subprocess
import sys
import warnings
import zlib
from dataclasses import fields
from typing import Any, get_args

import hypothesis
import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from PIL import (
    Image,
    ImageChops,
    ImageCms,
    ImageFile,
    ImageFilter,
    ImageOps,
    ImageStat,
    JpegImagePlugin,
)

from capabilities.protocol import WireError
from capabilities.work.context import CapabilityError, JobAborted
from capabilities.work.images import params as images_params
from capabilities.work.images import runner as images
from capabilities.work.images import spec as images_spec
from capabilities.work.registry import require
from tests.support.context import RecordingContext
from tests.support.paths import ROOT

IMAGE_SPEC = require("process.image")

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **options: Any) -> str:
    """`image` saved as `fmt`, base64-encoded."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return base64.b64encode(buffer.getvalue()).decode()


def picture(size: tuple[int, int] = (120, 80), mode: str = "RGB") -> Image.Image:
    """Smooth gradients under a red square at the top left: orientation is visible."""
    width, height = size
    across = Image.linear_gradient("L").rotate(90).resize(size)
    down = Image.linear_gradient("L").resize(size)
    image = Image.merge("RGB", (across, down, Image.new("L", size, 128)))
    image.paste(RED, (0, 0, width // 6, height // 6))
    return image.convert(mode)


def params(content: str, operations: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "image": {"content": content, "mimeType": "image/png", "encoding": "base64"},
        "operations": operations,
        **extra,
    }


def process(
    content: str,
    operations: list[dict[str, Any]],
    ctx: RecordingContext | None = None,
    **extra: Any,
) -> tuple[dict[str, Any], Image.Image]:
    """Run the runner; the result data and the saved image, decoded."""
    ctx = ctx or RecordingContext()
    data = images.run(params(content, operations, **extra), ctx)
    saved = ctx.files[data["image"]["$file"]]
    assert data["image"]["size"] == len(saved)
    output = Image.open(io.BytesIO(saved))
    output.load()
    assert (data["width"], data["height"]) == output.size
    return data, output


def refusal(raw: dict[str, Any], ctx: RecordingContext | None = None) -> CapabilityError:
    """Run the runner, expecting a CapabilityError; the error."""
    assert IMAGE_SPEC.validate(raw) is None, "the runner only sees valid params"
    with pytest.raises(CapabilityError) as caught:
        images.run(raw, ctx or RecordingContext())
    return caught.value


def wire_refusal(raw: dict[str, Any]) -> WireError:
    """The input schema's refusal, which the agent gets before any job is queued."""
    error = IMAGE_SPEC.validate(raw)
    assert error is not None
    return error


def limits(**overrides: Any) -> override_settings:
    return override_settings(ABP={**settings.ABP, **overrides})


def close(a: Image.Image, b: Image.Image, tolerance: float) -> bool:
    """Same size and mode, and a mean difference per channel of at most `tolerance`."""
    if (a.size, a.mode) != (b.size, b.mode):
        return False
    return max(ImageStat.Stat(ImageChops.difference(a, b)).mean) <= tolerance


def same(a: Image.Image, b: Image.Image) -> bool:
    return (a.size, a.mode) == (b.size, b.mode) and ImageChops.difference(a, b).getbbox() is None


def near(color: tuple[int, ...], expected: tuple[int, ...], tolerance: int = 40) -> bool:
    return all(abs(c - e) <= tolerance for c, e in zip(color, expected, strict=True))


def rgb(image: Image.Image, xy: tuple[int, int]) -> tuple[int, ...]:
    value = image.convert("RGB").getpixel(xy)
    assert isinstance(value, tuple)
    return value


PNG = encode(picture(), "PNG")


# --- Operations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "size"),
    [
        ({"width": 60}, (60, 40)),
        ({"height": 20}, (30, 20)),
        ({"width": 300}, (300, 200)),
        ({"width": 50, "height": 50}, (50, 50)),
        ({"width": 50, "height": 50, "fit": "cover"}, (50, 50)),
        ({"width": 50, "height": 50, "fit": "contain"}, (50, 50)),
        ({"width": 50, "height": 50, "fit": "fill"}, (50, 50)),
        ({"width": 50, "height": 50, "fit": "inside"}, (50, 33)),
        ({"width": 600, "height": 100, "fit": "inside"}, (150, 100)),
    ],
)
def test_resize_sizes(operation: dict[str, Any], size: tuple[int, int]) -> None:
    data, output = process(PNG, [{"type": "resize", **operation}])
    assert output.size == size
    assert output.format == "PNG"
    assert data["image"]["mimeType"] == "image/png"
    assert data["image"]["filename"] == "image.png"


def banded(size: tuple[int, int]) -> Image.Image:
    """Green on the outer quarters (left and right), blue in the middle."""
    image = Image.new("RGB", size, BLUE)
    quarter = size[0] // 4
    image.paste(GREEN, (0, 0, quarter, size[1]))
    image.paste(GREEN, (size[0] - quarter, 0, size[0], size[1]))
    return image


def test_cover_crops_the_overflow_evenly() -> None:
    # 400x200 into 100x100: the outer 100 pixels on each side (the green) go.
    _, output = process(
        encode(banded((400, 200)), "PNG"),
        [{"type": "resize", "width": 100, "height": 100, "fit": "cover"}],
    )
    for x in (2, 50, 97):
        assert near(rgb(output, (x, 50)), BLUE)


def test_contain_pads_with_white_or_transparency() -> None:
    operation = {"type": "resize", "width": 100, "height": 100, "fit": "contain"}
    _, output = process(encode(banded((400, 200)), "PNG"), [operation])
    # 100x50 centred: 25 rows of padding above and below.
    assert output.mode == "RGB"
    assert rgb(output, (50, 5)) == WHITE
    assert rgb(output, (50, 95)) == WHITE
    assert near(rgb(output, (50, 50)), BLUE)
    assert near(rgb(output, (5, 50)), GREEN)
    _, output = process(encode(banded((400, 200)).convert("RGBA"), "PNG"), [operation])
    assert output.mode == "RGBA"
    assert output.getpixel((50, 5))[3] == 0  # type: ignore[index]
    assert output.getpixel((50, 50))[3] == 255  # type: ignore[index]


def test_fill_stretches_everything_in() -> None:
    operation = {"type": "resize", "width": 100, "height": 100, "fit": "fill"}
    _, output = process(encode(banded((400, 200)), "PNG"), [operation])
    assert near(rgb(output, (5, 50)), GREEN)
    assert near(rgb(output, (50, 50)), BLUE)
    assert near(rgb(output, (95, 50)), GREEN)


@pytest.mark.parametrize(
    ("box", "size"),
    [((60, 60), (60, 40)), ((60, 10), (15, 10)), ((500, 500), (120, 80)), ((120, 80), (120, 80))],
)
def test_thumbnail_keeps_the_ratio_and_never_enlarges(
    box: tuple[int, int], size: tuple[int, int]
) -> None:
    _, output = process(PNG, [{"type": "thumbnail", "width": box[0], "height": box[1]}])
    assert output.size == size


def test_crop_keeps_exactly_the_box() -> None:
    source = picture()
    _, output = process(PNG, [{"type": "crop", "left": 10, "top": 5, "width": 50, "height": 30}])
    assert same(output, source.crop((10, 5, 60, 35)))


def test_rotate_is_clockwise_and_expands_by_default() -> None:
    _, output = process(PNG, [{"type": "rotate", "degrees": 90}])
    assert output.size == (80, 120)
    # The red top-left corner is now the top-right one.
    assert rgb(output, (75, 5)) == RED
    assert same(output, picture().transpose(Image.Transpose.ROTATE_270))
    _, output = process(PNG, [{"type": "rotate", "degrees": -90}])
    assert rgb(output, (5, 115)) == RED


def test_rotate_by_an_angle() -> None:
    _, expanded = process(PNG, [{"type": "rotate", "degrees": 30}])
    assert expanded.size == picture().rotate(-30, expand=True).size
    assert expanded.size > (120, 80)
    assert rgb(expanded, (0, 0)) == WHITE  # an uncovered corner
    _, kept = process(PNG, [{"type": "rotate", "degrees": 30, "expand": False}])
    assert kept.size == (120, 80)
    transparent = encode(picture(mode="RGBA"), "PNG")
    _, output = process(transparent, [{"type": "rotate", "degrees": 45}])
    assert output.mode == "RGBA"
    assert output.getpixel((0, 0))[3] == 0  # type: ignore[index]


@hypothesis.given(
    width=st.integers(1, 300),
    height=st.integers(1, 300),
    degrees=st.floats(-360, 360, allow_nan=False),
)
@hypothesis.settings(max_examples=60, deadline=None)
def test_planned_rotation_sizes_are_pillows(width: int, height: int, degrees: float) -> None:
    operations = (images.Rotate(degrees=degrees, expand=True),)
    unlimited = images.Limits(input_bytes=1, pixels=10**9, dimension=10**5, output_bytes=1)
    planned = images.plan(operations, (width, height), unlimited)
    assert planned == [Image.new("L", (width, height)).rotate(-degrees, expand=True).size]


@pytest.mark.parametrize(
    ("direction", "moved"),
    [
        ("horizontal", Image.Transpose.FLIP_LEFT_RIGHT),
        ("vertical", Image.Transpose.FLIP_TOP_BOTTOM),
    ],
)
def test_flip(direction: str, moved: Image.Transpose) -> None:
    _, output = process(PNG, [{"type": "flip", "direction": direction}])
    assert same(output, picture().transpose(moved))
    corner = (115, 5) if direction == "horizontal" else (5, 75)
    assert rgb(output, corner) == RED


@pytest.mark.parametrize(
    ("operation", "kernel"),
    [
        ({"type": "blur", "radius": 2.5}, ImageFilter.GaussianBlur(2.5)),
        ({"type": "blur", "radius": 0}, ImageFilter.GaussianBlur(0)),
        ({"type": "sharpen"}, ImageFilter.UnsharpMask(2, 150, 3)),
        (
            {"type": "sharpen", "radius": 4, "percent": 300, "threshold": 0},
            ImageFilter.UnsharpMask(4, 300, 0),
        ),
    ],
)
def test_filters_match_pillows(operation: dict[str, Any], kernel: ImageFilter.Filter) -> None:
    _, output = process(PNG, [operation])
    assert same(output, picture().filter(kernel))


@pytest.mark.parametrize(
    ("operation", "kernel"),
    [
        ({"type": "blur", "radius": 0.5}, ImageFilter.GaussianBlur(0.5)),
        ({"type": "blur", "radius": 3}, ImageFilter.GaussianBlur(3)),
        ({"type": "blur", "radius": 7.3}, ImageFilter.GaussianBlur(7.3)),
        ({"type": "sharpen", "radius": 2}, ImageFilter.UnsharpMask(2, 150, 3)),
        ({"type": "sharpen", "radius": 5, "threshold": 0}, ImageFilter.UnsharpMask(5, 150, 0)),
    ],
)
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_filters_in_bands_are_exact(
    monkeypatch: pytest.MonkeyPatch,
    operation: dict[str, Any],
    kernel: ImageFilter.Filter,
    mode: str,
) -> None:
    noise = Image.effect_noise((90, 400), 80)
    bands = (noise, noise.rotate(180), noise.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    gradient = Image.linear_gradient("L").resize(noise.size)
    source = Image.merge("RGBA", (*bands, gradient)).convert(mode)
    source.paste(Image.new(mode, (50, 30), "white"), (20, 100))
    content = encode(source, "PNG")
    one_shot = RecordingContext()
    _, expected = process(content, [operation], one_shot)
    assert same(expected, source.filter(kernel))
    monkeypatch.setattr(images, "_BAND_PIXELS", 1)
    in_bands = RecordingContext()
    _, output = process(content, [operation], in_bands)
    assert same(output, expected)
    assert in_bands.checkpoints > one_shot.checkpoints + 2  # one per band


@pytest.mark.parametrize(("mode", "expected"), [("RGB", "L"), ("RGBA", "LA"), ("L", "L")])
def test_grayscale(mode: str, expected: str) -> None:
    _, output = process(encode(picture(mode=mode), "PNG"), [{"type": "grayscale"}])
    assert output.mode == expected
    assert output.size == (120, 80)


def test_compress_sets_the_jpeg_quality() -> None:
    content = encode(picture((200, 150)), "PNG")
    sizes = {}
    for quality in (10, 95):
        data, output = process(content, [{"type": "compress", "quality": quality}], format="jpeg")
        assert output.format == "JPEG"
        sizes[quality] = data["image"]["size"]
    assert sizes[10] < sizes[95] / 2
    # The last word wins: compress after the top-level quality.
    data, _ = process(content, [{"type": "compress", "quality": 10}], format="jpeg", quality=95)
    assert data["image"]["size"] == sizes[10]


@pytest.mark.parametrize(
    ("fmt", "pillow", "mime", "filename"),
    [
        ("jpeg", "JPEG", "image/jpeg", "image.jpg"),
        ("png", "PNG", "image/png", "image.png"),
        ("webp", "WEBP", "image/webp", "image.webp"),
        ("gif", "GIF", "image/gif", "image.gif"),
        ("tiff", "TIFF", "image/tiff", "image.tiff"),
    ],
)
def test_convert_and_format(fmt: str, pillow: str, mime: str, filename: str) -> None:
    cases: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([{"type": "convert", "format": fmt}], {}),
        ([], {"format": fmt}),
    ]
    for operations, extra in cases:
        data, output = process(PNG, operations, **extra)
        assert output.format == pillow
        assert output.size == (120, 80)
        assert (data["image"]["mimeType"], data["image"]["filename"]) == (mime, filename)
        assert near(rgb(output, (3, 3)), RED, 60)


def test_convert_wins_over_format() -> None:
    _, output = process(PNG, [{"type": "convert", "format": "gif"}], format="webp")
    assert output.format == "GIF"


# --- Formats, orientation and the JPEG fast path -------------------------------------


def jpeg(image: Image.Image, orientation: int = 1, **options: Any) -> str:
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif, **options)


def test_exif_orientation_is_applied_first() -> None:
    _, output = process(jpeg(picture((60, 40)), orientation=6), [])
    assert output.size == (40, 60)
    assert output.format == "JPEG"
    assert near(rgb(output, (37, 3)), RED)
    assert output.getexif().get(0x0112) is None


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_agrees_with_exif_transpose(orientation: int) -> None:
    content = jpeg(picture((60, 40)), orientation)
    reference = ImageOps.exif_transpose(Image.open(io.BytesIO(base64.b64decode(content))))
    _, output = process(content, [], format="png")
    assert same(output, reference)


def png_with_trailing_orientation(image: Image.Image, orientation: int) -> str:
    """A PNG whose eXIf chunk (the orientation) comes after the pixels."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    data = buffer.getvalue()
    exif = Image.Exif()
    exif[0x0112] = orientation
    body = exif.tobytes().removeprefix(b"Exif\x00\x00")
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body
    chunk += struct.pack(">I", zlib.crc32(b"eXIf" + body))
    end = data.rindex(b"IEND") - 4
    return base64.b64encode(data[:end] + chunk + data[end:]).decode()


def test_an_orientation_after_a_pngs_pixels_is_applied_and_planned() -> None:
    content = png_with_trailing_orientation(picture((60, 40)), 6)
    _, output = process(content, [])
    assert output.size == (40, 60)
    assert rgb(output, (37, 3)) == RED
    # Fits the stored 60x40, not the 40x60 picture: refused once the pixels are read.
    error = refusal(
        params(content, [{"type": "crop", "left": 0, "top": 0, "width": 60, "height": 10}])
    )
    assert (error.code, error.details) == ("INVALID_PARAMS", {"path": "params.operations[0]"})


class DraftSpy:
    """Records the JPEG drafts: what was asked, and the size decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[tuple[int, int], tuple[int, int] | None, tuple[int, int]]] = []
        original = JpegImagePlugin.JpegImageFile.draft

        def draft(
            image: JpegImagePlugin.JpegImageFile, mode: str | None, size: tuple[int, int] | None
        ) -> Any:
            before = image.size
            result = original(image, mode, size)
            self.calls.append((before, size, image.size))
            return result

        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft)


def without_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "_draft_size", lambda operations, size: None)


def slow_path(
    monkeypatch: pytest.MonkeyPatch, content: str, operations: list[dict[str, Any]], **extra: Any
) -> Image.Image:
    with monkeypatch.context() as patch:
        without_draft(patch)
        return process(content, operations, **extra)[1]


@pytest.mark.parametrize(
    ("operation", "draft", "decoded", "size"),
    [
        (
            {"type": "resize", "width": 100, "height": 75, "fit": "fill"},
            (100, 75),
            (100, 75),
            (100, 75),
        ),
        ({"type": "resize", "width": 190}, (190, 143), (200, 150), (190, 143)),
        ({"type": "thumbnail", "width": 300, "height": 300}, (300, 225), (400, 300), (300, 225)),
        (
            {"type": "resize", "width": 60, "height": 60, "fit": "cover"},
            (80, 60),
            (100, 75),
            (60, 60),
        ),
        (
            {"type": "resize", "width": 60, "height": 60, "fit": "contain"},
            (60, 45),
            (100, 75),
            (60, 60),
        ),
    ],
)
def test_a_shrinking_jpeg_is_decoded_at_a_reduced_scale(
    monkeypatch: pytest.MonkeyPatch,
    operation: dict[str, Any],
    draft: tuple[int, int],
    decoded: tuple[int, int],
    size: tuple[int, int],
) -> None:
    content = jpeg(picture((800, 600)))
    spy = DraftSpy(monkeypatch)
    _, output = process(content, [operation], format="png")
    assert spy.calls == [((800, 600), draft, decoded)]
    assert output.size == size
    assert close(output, slow_path(monkeypatch, content, [operation], format="png"), 1.0)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_fast_path_honours_the_orientation(
    monkeypatch: pytest.MonkeyPatch, orientation: int
) -> None:
    # 803x601: the reduced image is rounded up, so the draft's box matters.
    content = jpeg(picture((803, 601)), orientation)
    operation = {"type": "resize", "width": 90}
    spy = DraftSpy(monkeypatch)
    _, output = process(content, [operation], format="png")
    assert len(spy.calls) == 1
    assert spy.calls[0][2][0] < 803 // 2
    expected = slow_path(monkeypatch, content, [operation], format="png")
    assert output.size == expected.size == ((90, 67) if orientation < 5 else (90, 120))
    assert close(output, expected, 1.0)


def test_the_transposed_draft_box_matches_pillows_transpose() -> None:
    width, height = 7, 4
    for method, move in images._MOVES.items():
        for x in range(width):
            for y in range(height):
                dot = Image.new("L", (width, height))
                dot.putpixel((x, y), 255)
                box = dot.transpose(method).getbbox()
                assert box is not None
                assert move(x + 0.5, y + 0.5, width, height) == (box[0] + 0.5, box[1] + 0.5)


@pytest.mark.parametrize(
    "operations",
    [
        [
            {"type": "crop", "left": 0, "top": 0, "width": 700, "height": 500},
            {"type": "resize", "width": 100},
        ],
        [{"type": "blur", "radius": 1}, {"type": "resize", "width": 100}],
        [{"type": "resize", "width": 1600}],
        [{"type": "rotate", "degrees": 90}, {"type": "thumbnail", "width": 50, "height": 50}],
    ],
)
def test_no_draft_unless_the_first_geometric_operation_shrinks(
    monkeypatch: pytest.MonkeyPatch, operations: list[dict[str, Any]]
) -> None:
    spy = DraftSpy(monkeypatch)
    process(jpeg(picture((800, 600))), operations)
    assert spy.calls == []


def test_grayscale_and_output_settings_may_come_before_the_draft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    content = jpeg(picture((800, 600)))
    operations: list[dict[str, Any]] = [
        {"type": "compress", "quality": 90},
        {"type": "grayscale"},
        {"type": "convert", "format": "png"},
        {"type": "resize", "width": 100},
    ]
    spy = DraftSpy(monkeypatch)
    _, output = process(content, operations)
    assert spy.calls == [((800, 600), (100, 75), (100, 75))]
    assert (output.format, output.mode, output.size) == ("PNG", "L", (100, 75))
    assert close(output, slow_path(monkeypatch, content, operations), 1.0)


def test_fast_downscale_is_the_runners_own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = base64.b64decode(jpeg(picture((800, 600)), orientation=8))
    spy = DraftSpy(monkeypatch)
    fast = images.fast_downscale(data, (75, 100))
    assert spy.calls == [((800, 600), (100, 75), (100, 75))]
    operation = {"type": "resize", "width": 75, "height": 100, "fit": "fill"}
    _, output = process(base64.b64encode(data).decode(), [operation], format="png")
    assert same(output, fast)


def test_an_mpo_is_read_as_its_first_picture(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.BytesIO()
    first, second = picture((400, 300)), Image.new("RGB", (400, 300), BLUE)
    first.save(buffer, "MPO", save_all=True, append_images=[second], quality=95)
    spy = DraftSpy(monkeypatch)
    data, output = process(
        base64.b64encode(buffer.getvalue()).decode(), [{"type": "resize", "width": 100}]
    )
    assert len(spy.calls) == 1
    assert (output.format, output.size) == ("JPEG", (100, 75))
    assert data["image"]["mimeType"] == "image/jpeg"
    assert near(rgb(output, (3, 3)), RED)


def test_gif_input_is_its_first_frame() -> None:
    frames = [Image.new("RGB", (30, 20), color) for color in (RED, BLUE, GREEN)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    content = base64.b64encode(buffer.getvalue()).decode()
    data, output = process(content, [{"type": "resize", "width": 15}])
    assert output.format == "GIF"
    assert getattr(output, "n_frames", 1) == 1
    assert output.size == (15, 10)
    assert rgb(output, (7, 5)) == RED
    assert data["image"]["mimeType"] == "image/gif"


def test_tiff_in_and_out() -> None:
    data, output = process(
        encode(picture(), "TIFF"), [{"type": "thumbnail", "width": 60, "height": 60}]
    )
    assert (output.format, output.size, output.mode) == ("TIFF", (60, 40), "RGB")
    assert (data["image"]["mimeType"], data["image"]["filename"]) == ("image/tiff", "image.tiff")
    assert near(rgb(output, (2, 2)), RED)


def test_webp_in_and_out() -> None:
    source = picture(mode="RGBA")
    source.paste((0, 0, 0, 0), (60, 0, 120, 80))
    _, output = process(
        encode(source, "WEBP", lossless=True), [{"type": "flip", "direction": "horizontal"}]
    )
    assert (output.format, output.mode, output.size) == ("WEBP", "RGBA", (120, 80))
    assert output.getpixel((10, 10))[3] == 0  # type: ignore[index]
    assert output.getpixel((110, 10))[3] == 255  # type: ignore[index]


def test_rgba_png_to_jpeg_is_flattened_on_white() -> None:
    source = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    source.paste((0, 0, 255, 255), (0, 0, 20, 40))
    _, output = process(encode(source, "PNG"), [], format="jpeg")
    assert (output.format, output.mode) == ("JPEG", "RGB")
    assert near(rgb(output, (30, 20)), WHITE, 10)
    assert near(rgb(output, (5, 20)), BLUE, 30)


@pytest.mark.parametrize("mode", ["P", "LA", "1", "CMYK"])
def test_other_modes_are_read(mode: str) -> None:
    source = picture().convert(mode)
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    _, output = process(encode(source, fmt), [{"type": "blur", "radius": 1}], format="jpeg")
    assert (output.format, output.size) == ("JPEG", (120, 80))


def test_16_bit_grayscale_is_scaled_not_clipped() -> None:
    source = Image.new("I;16", (8, 8), 32768)
    _, output = process(encode(source, "PNG"), [])
    assert output.mode == "L"
    assert output.getpixel((4, 4)) == 128


def test_the_colour_profile_is_kept_while_it_fits() -> None:
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    content = jpeg(picture(), icc_profile=profile)
    _, output = process(content, [{"type": "resize", "width": 60}])
    assert output.info.get("icc_profile") == profile
    _, output = process(content, [{"type": "grayscale"}])
    assert "icc_profile" not in output.info


# --- Refusals ---------------------------------------------------------------------------


def png_header_only(width: int, height: int) -> bytes:
    """A PNG announcing width x height gray pixels, with only its first rows of zeros."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 8)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def never_decodes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    loads: list[object] = []
    original = ImageFile.ImageFile.load

    def load(image: ImageFile.ImageFile) -> Any:
        loads.append(image)
        return original(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return loads


def test_a_decompression_bomb_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = png_header_only(30_000, 30_000)
    assert len(bomb) < 2000
    loads = never_decodes(monkeypatch)
    error = refusal(params(base64.b64encode(bomb).decode(), []))
    assert error.code == "INVALID_PARAMS"
    assert error.details is not None
    assert error.details["path"] == "params.image.content"
    assert loads == []


def test_the_pixel_limit_is_checked_on_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    content = encode(Image.new("L", (2000, 1000)), "PNG")
    loads = never_decodes(monkeypatch)
    with limits(MAX_IMAGE_PIXELS=1_000_000):
        error = refusal(params(content, [{"type": "resize", "width": 10}]))
    assert error.code == "INVALID_PARAMS"
    assert error.details is not None
    assert error.details["path"] == "params.image.content"
    assert error.details["limit"] == 1_000_000
    assert loads == []
    with limits(MAX_IMAGE_PIXELS=2_000_000):
        assert process(content, [{"type": "resize", "width": 10}])[1].size == (10, 5)


def test_pillows_bomb_warning_is_an_error_in_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pillow warns between its limit and twice its limit; our own check is bypassed here.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    monkeypatch.setattr(images, "_check_size", lambda size, limits, path: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not pytest's error filter: the runner's own
        error = refusal(params(encode(Image.new("L", (40, 40)), "PNG"), []))
    assert (error.code, error.details) == (
        "INVALID_PARAMS",
        {"path": "params.image.content", "limit": 1000},
    )


@pytest.mark.parametrize(
    ("operations", "overrides", "path"),
    [
        (
            [{"type": "resize", "width": 2000, "height": 2000}],
            {"MAX_IMAGE_PIXELS": 1_000_000},
            "params.operations[0]",
        ),
        (
            [{"type": "resize", "height": 100}, {"type": "resize", "height": 9000}],
            {"MAX_IMAGE_DIMENSION": 10_000},
            "params.operations[1]",
        ),
        ([{"type": "rotate", "degrees": 45}], {"MAX_IMAGE_DIMENSION": 130}, "params.operations[0]"),
        (
            [{"type": "rotate", "degrees": 45, "expand": False}, {"type": "rotate", "degrees": 30}],
            {"MAX_IMAGE_PIXELS": 12_000},
            "params.operations[1]",
        ),
    ],
)
def test_outputs_over_the_limits_are_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
    operations: list[dict[str, Any]],
    overrides: dict[str, int],
    path: str,
) -> None:
    loads = never_decodes(monkeypatch)
    with limits(**overrides):
        error = refusal(params(PNG, operations))
    assert error.code == "INVALID_PARAMS"
    assert error.details is not None
    assert error.details["path"] == path
    assert loads == []


@pytest.mark.parametrize(
    "data",
    [
        encode(picture(), "BMP"),
        encode(picture(), "PPM"),
        encode(picture(), "ICO"),
        base64.b64encode(random.Random(0).randbytes(2000)).decode(),
        base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>").decode(),
    ],
)
def test_other_formats_are_refused(data: str) -> None:
    error = refusal(params(data, []))
    assert (error.code, error.details) == ("INVALID_PARAMS", {"path": "params.image.content"})
    assert "JPEG, PNG, WebP, GIF or TIFF" in error.message


def test_a_truncated_image_is_refused() -> None:
    data = base64.b64decode(jpeg(picture((300, 200))))
    error = refusal(params(base64.b64encode(data[: len(data) // 2]).decode(), []))
    assert (error.code, error.details) == ("INVALID_PARAMS", {"path": "params.image.content"})


@pytest.mark.parametrize(
    "content",
    [
        "not base64!",
        "iVBORw0KGgo=====",
        "aGVsbG8",
        "é" * 8,
        "data:image/png;base64," + PNG,
    ],
)
def test_content_that_is_not_base64_is_refused(content: str) -> None:
    error = refusal(params(content, []))
    assert (error.code, error.details) == ("INVALID_PARAMS", {"path": "params.image.content"})


def test_line_wrapped_base64_is_forgiven() -> None:
    wrapped = "\n".join(PNG[i : i + 76] for i in range(0, len(PNG), 76))
    assert process(wrapped, [])[1].size == (120, 80)


def test_an_image_over_the_byte_limit_is_refused() -> None:
    size = len(base64.b64decode(PNG))
    with limits(MAX_IMAGE_BYTES=size - 1):
        error = refusal(params(PNG, []))
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.image.content", "limit": size - 1}
    with limits(MAX_IMAGE_BYTES=100):
        # Far too long a text is the schema's to refuse, before it is stored or decoded.
        assert wire_refusal(params(PNG * 10, [])).details == {
            "path": "params.image.content",
            "rule": "maxLength",
            "limit": 100,
        }
    with limits(MAX_IMAGE_BYTES=size):
        assert process(PNG, [])[1].size == (120, 80)


def test_an_output_over_the_byte_limit_is_refused() -> None:
    noisy = encode(Image.effect_noise((200, 200), 100), "JPEG")
    with limits(MAX_IMAGE_OUTPUT_BYTES=10_000):
        ctx = RecordingContext()
        error = refusal(params(noisy, [], format="png"), ctx)
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params", "limit": 10_000}
    assert ctx.files == {}


def test_a_format_that_cannot_hold_the_size_is_refused() -> None:
    wide = encode(Image.new("L", (16_384, 1)), "PNG")
    error = refusal(params(wide, [{"type": "convert", "format": "webp"}]))
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.operations[0].format", "limit": 16_383}


def test_a_crop_outside_the_image_is_refused() -> None:
    crop = {"type": "crop", "left": 50, "top": 0, "width": 20, "height": 20}
    # After the resize the image is 60x40: the crop sticks out on the right.
    error = refusal(params(PNG, [{"type": "resize", "width": 60}, crop]))
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.operations[1]"}
    assert "60x40" in error.message
    assert process(PNG, [crop])[1].size == (20, 20)


IMAGE = {"content": PNG, "encoding": "base64"}


# Params the input schema refuses never reach the runner: these are the wire's errors.
@pytest.mark.parametrize(
    ("raw", "code", "path"),
    [
        ({}, "MISSING_PARAM", "params.image"),
        ({"image": PNG}, "INVALID_TYPE", "params.image"),
        ({"image": {"encoding": "base64"}}, "MISSING_PARAM", "params.image.content"),
        ({"image": {"content": 7}}, "INVALID_TYPE", "params.image.content"),
        ({"image": {"content": ""}}, "INVALID_PARAMS", "params.image.content"),
        ({"image": {**IMAGE, "encoding": "hex"}}, "INVALID_PARAMS", "params.image.encoding"),
        ({"image": {**IMAGE, "size": -1}}, "INVALID_PARAMS", "params.image.size"),
        ({"image": {**IMAGE, "size": 2**63}}, "INVALID_PARAMS", "params.image.size"),
        ({"image": {**IMAGE, "url": "x"}}, "INVALID_PARAMS", "params.image"),
        ({"image": IMAGE, "extra": 1}, "INVALID_PARAMS", "params"),
        ({"image": IMAGE, "operations": {}}, "INVALID_TYPE", "params.operations"),
        ({"image": IMAGE, "operations": [{"type": "grayscale"}] * 101}, "INVALID_PARAMS",
         "params.operations"),
        ({"image": IMAGE, "format": "jpg"}, "INVALID_PARAMS", "params.format"),
        ({"image": IMAGE, "quality": 101}, "INVALID_PARAMS", "params.quality"),
    ],
)  # fmt: skip
def test_unusable_params_are_refused(raw: dict[str, Any], code: str, path: str) -> None:
    error = wire_refusal(raw)
    assert error.code == code
    assert error.details is not None
    assert error.details["path"] == path


@pytest.mark.parametrize(
    ("operation", "code", "field"),
    [
        # Not an operation of any type: the schema's oneOf names the operation.
        ("resize", "INVALID_PARAMS", ""),
        ({}, "INVALID_PARAMS", ""),
        ({"type": "sepia"}, "INVALID_PARAMS", ""),
        ({"type": "grayscale", "amount": 1}, "INVALID_PARAMS", ""),
        ({"type": "resize"}, "MISSING_PARAM", ".height"),
        ({"type": "resize", "width": 0}, "INVALID_PARAMS", ".width"),
        ({"type": "resize", "width": 50_000}, "INVALID_PARAMS", ".width"),
        ({"type": "resize", "width": "9"}, "INVALID_TYPE", ".width"),
        ({"type": "resize", "width": True}, "INVALID_TYPE", ".width"),
        ({"type": "resize", "width": 9.5}, "INVALID_TYPE", ".width"),
        ({"type": "resize", "width": 9, "fit": "crop"}, "INVALID_PARAMS", ".fit"),
        ({"type": "thumbnail", "width": 9}, "MISSING_PARAM", ".height"),
        ({"type": "crop", "left": -1, "top": 0, "width": 1, "height": 1}, "INVALID_PARAMS",
         ".left"),
        ({"type": "rotate", "degrees": 400}, "INVALID_PARAMS", ".degrees"),
        ({"type": "rotate", "degrees": 9, "expand": 1}, "INVALID_TYPE", ".expand"),
        ({"type": "flip", "direction": "diagonal"}, "INVALID_PARAMS", ".direction"),
        ({"type": "blur", "radius": 101}, "INVALID_PARAMS", ".radius"),
        # What JSON's 1e400 decodes to (a NaN cannot be sent: the codec refuses it).
        ({"type": "blur", "radius": float("inf")}, "INVALID_PARAMS", ".radius"),
        ({"type": "sharpen", "threshold": 256}, "INVALID_PARAMS", ".threshold"),
        ({"type": "compress", "quality": 0}, "INVALID_PARAMS", ".quality"),
        ({"type": "convert", "format": "bmp"}, "INVALID_PARAMS", ".format"),
    ],
)  # fmt: skip
def test_unusable_operations_are_refused(operation: object, code: str, field: str) -> None:
    grayscale = {"type": "grayscale"}
    error = wire_refusal({"image": IMAGE, "operations": [grayscale, operation]})
    assert error.code == code
    assert error.details is not None
    assert error.details["path"] == f"params.operations[1]{field}"


def test_a_side_over_the_servers_limit_is_refused_before_queueing() -> None:
    resize = {"image": IMAGE, "operations": [{"type": "resize", "width": 120, "height": 200}]}
    assert IMAGE_SPEC.validate(resize) is None
    with limits(MAX_IMAGE_DIMENSION=150):
        error = wire_refusal(resize)
    assert (error.code, error.details) == (
        "INVALID_PARAMS",
        {"path": "params.operations[0].height", "rule": "maximum"},
    )


def test_integers_written_as_floats_are_integers() -> None:
    # JSON Schema's integers include 60.0, which some JSON encoders write for 60.
    _, output = process(PNG, [{"type": "resize", "width": 60.0}], quality=90.0)
    assert output.size == (60, 40)


def test_output_binary_data_may_be_passed_back_as_input() -> None:
    ctx = RecordingContext()
    images.run(params(PNG, [{"type": "resize", "width": 60}]), ctx)
    saved = next(iter(ctx.files.values()))
    again = {
        "content": base64.b64encode(saved).decode(),
        "mimeType": "image/png",
        "encoding": "base64",
        "size": len(saved),
        "filename": "image.png",
    }
    data = images.run({"image": again, "operations": [{"type": "resize", "width": 30}]}, ctx)
    assert (data["width"], data["height"]) == (30, 20)


# --- Progress and cancellation ------------------------------------------------------------


OPERATIONS: list[dict[str, Any]] = [
    {"type": "resize", "width": 100},
    {"type": "grayscale"},
    {"type": "blur", "radius": 1},
    {"type": "flip", "direction": "horizontal"},
]


def test_progress_is_reported_per_operation() -> None:
    ctx = RecordingContext()
    process(PNG, OPERATIONS, ctx)
    assert ctx.reports == [
        {"progress": 0, "total": 4, "stage": "decode"},
        {"progress": 1, "total": 4, "stage": "resize"},
        {"progress": 2, "total": 4, "stage": "grayscale"},
        {"progress": 3, "total": 4, "stage": "blur"},
        {"progress": 4, "total": 4, "stage": "flip"},
        {"progress": 4, "total": 4, "stage": "encode"},
    ]
    assert ctx.checkpoints >= len(OPERATIONS) + 2


def test_an_abort_at_any_checkpoint_stops_the_work() -> None:
    probe = RecordingContext()
    process(PNG, OPERATIONS, probe)
    for n in range(1, probe.checkpoints + 1):
        ctx = RecordingContext(abort_after_checkpoints=n)
        with pytest.raises(JobAborted):
            images.run(params(PNG, OPERATIONS), ctx)
        assert ctx.checkpoints == n
        assert ctx.files == {}


class AbortAfterStage(RecordingContext):
    """Aborts at the first checkpoint after `stage` was reported."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def checkpoint(self) -> None:
        super().checkpoint()
        if self.reports and self.reports[-1]["stage"] == self.stage:
            raise JobAborted


@pytest.mark.parametrize("stage", ["decode", "resize", "grayscale", "blur", "flip"])
def test_an_abort_after_an_operation_skips_the_rest(stage: str) -> None:
    ctx = AbortAfterStage(stage)
    with pytest.raises(JobAborted):
        images.run(params(PNG, OPERATIONS), ctx)
    stages = [report["stage"] for report in ctx.reports]
    assert stages == ["decode", *(o["type"] for o in OPERATIONS)][: stages.index(stage) + 1]
    assert stages[-1] == stage
    assert ctx.files == {}


@pytest.mark.stack  # a process of its own
def test_warm_up_runs() -> None:
    images.warm_up()


# --- Schemas --------------------------------------------------------------------------------


INPUT_VALIDATOR = Draft202012Validator(images_spec.INPUT_SCHEMA)
OUTPUT_VALIDATOR = Draft202012Validator(images_spec.OUTPUT_SCHEMA)


def test_schemas_are_draft_2020_12() -> None:
    Draft202012Validator.check_schema(images_spec.INPUT_SCHEMA)
    Draft202012Validator.check_schema(images_spec.OUTPUT_SCHEMA)
    assert IMAGE_SPEC.name == "process.image"
    assert IMAGE_SPEC.warm_up == "capabilities.work.images.runner.warm_up"
    described = IMAGE_SPEC.describe()["inputSchema"]
    content = described["properties"]["image"]["properties"]["content"]
    # The manifest's schema is the module's, with the server's size limit added.
    assert content.pop("maxLength") > 0
    assert described == images_spec.INPUT_SCHEMA


@pytest.mark.stack  # a fresh interpreter
def test_the_spec_does_not_load_pillow() -> None:
    code = "import sys, capabilities.work.images.spec; assert 'PIL' not in sys.modules"
    root = ROOT
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


VALID_PARAMS = [
    {"image": {"content": PNG}},
    {"image": {"content": PNG, "mimeType": "image/png", "encoding": "base64"}, "operations": []},
    {
        "image": {"content": PNG, "encoding": "base64"},
        "operations": [
            {"type": "resize", "width": 100},
            {"type": "resize", "height": 100, "fit": "inside"},
            {"type": "resize", "width": 10, "height": 10, "fit": "contain"},
            {"type": "thumbnail", "width": 64, "height": 64},
            {"type": "crop", "left": 0, "top": 0, "width": 5, "height": 5},
            {"type": "rotate", "degrees": -45.5, "expand": False},
            {"type": "flip", "direction": "vertical"},
            {"type": "blur", "radius": 0.5},
            {"type": "sharpen"},
            {"type": "sharpen", "radius": 1, "percent": 200, "threshold": 0},
            {"type": "grayscale"},
            {"type": "compress", "quality": 50},
            {"type": "convert", "format": "webp"},
        ],
        "format": "png",
        "quality": 90,
    },
]


@pytest.mark.parametrize("raw", VALID_PARAMS)
def test_the_input_schema_and_the_runner_accept(raw: dict[str, Any]) -> None:
    assert list(INPUT_VALIDATOR.iter_errors(raw)) == []
    assert images.run(raw, RecordingContext())["width"] >= 1


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ({}, "required"),
        ({"image": {"content": PNG, "encoding": "hex"}}, "const"),
        ({"image": {"mimeType": "image/png"}}, "required"),
        ({"image": {"content": PNG}, "extra": 1}, "additionalProperties"),
        ({"image": {"content": PNG}, "format": "bmp"}, "enum"),
        ({"image": {"content": PNG}, "quality": 0}, "minimum"),
        ({"image": {"content": PNG}, "operations": [{"type": "resize"}]}, "oneOf"),
        ({"image": {"content": PNG}, "operations": [{"type": "sepia"}]}, "oneOf"),
        ({"image": {"content": PNG}, "operations": [{"type": "grayscale", "x": 1}]}, "oneOf"),
        ({"image": {"content": PNG}, "operations": [{"type": "resize", "width": 16385}]}, "oneOf"),
        ({"image": {"content": PNG}, "operations": [{"type": "grayscale"}] * 101}, "maxItems"),
    ],
)
def test_the_input_schema_rejects(raw: dict[str, Any], rule: str) -> None:
    assert rule in {error.validator for error in INPUT_VALIDATOR.iter_errors(raw)}
    wire_refusal(raw)


def test_each_operation_type_has_one_schema_variant() -> None:
    variants = images_spec.INPUT_SCHEMA["properties"]["operations"]["items"]["oneOf"]
    types = [variant["properties"]["type"]["const"] for variant in variants]
    assert types == [t.value for t in images_spec.OperationType]
    for variant in variants:
        assert variant["additionalProperties"] is False
        # The runner reads each operation into its dataclass, field by field.
        kind = next(
            cls for cls in get_args(images_params.Operation) if cls.kind.value == variant["title"]
        )
        assert set(variant["properties"]) - {"type"} == {field.name for field in fields(kind)}


@pytest.mark.parametrize(
    "image",
    [
        {
            "content": "iVBORw0=",
            "mimeType": "image/png",
            "encoding": "base64",
            "size": 5,
            "filename": "image.png",
        },
        {
            "downloadUrl": "https://app.example.com/abp/files/abc?sig=1",
            "mimeType": "image/webp",
            "size": 12_000_000,
            "filename": "image.webp",
            "expiresAt": "2030-01-01T00:00:00Z",
        },
    ],
)
def test_the_output_schema_accepts_both_wire_forms(image: dict[str, Any]) -> None:
    assert list(OUTPUT_VALIDATOR.iter_errors({"image": image, "width": 1, "height": 2})) == []


@pytest.mark.parametrize(
    "data",
    [
        {
            "image": {"mimeType": "image/png", "size": 1, "filename": "a.png"},
            "width": 1,
            "height": 1,
        },
        {
            "image": {
                "content": "x",
                "mimeType": "application/pdf",
                "encoding": "base64",
                "size": 1,
                "filename": "a.pdf",
            },
            "width": 1,
            "height": 1,
        },
        {
            "image": {
                "content": "x",
                "mimeType": "image/png",
                "encoding": "base64",
                "size": 1,
                "filename": "a.png",
            },
            "width": 0,
            "height": 1,
        },
    ],
)
def test_the_output_schema_rejects(data: dict[str, Any]) -> None:
    assert list(OUTPUT_VALIDATOR.iter_errors(data)) != []


def test_the_runners_output_matches_the_output_schema() -> None:
    ctx = RecordingContext()
    data = images.run(params(PNG, [{"type": "resize", "width": 10}]), ctx)
    file_id = data["image"].pop("$file")
    inline = {**data["image"], "content": base64.b64encode(ctx.files[file_id]).decode()}
    assert (
        list(OUTPUT_VALIDATOR.iter_errors({**data, "image": {**inline, "encoding": "base64"}}))
        == []
    )
