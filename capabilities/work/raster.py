"""Raster images, as both process.image and export.pdf read them: formats and limits."""

from __future__ import annotations

from dataclasses import dataclass

from capabilities.conf import abp_settings

# Pillow's names of the raster formats read (process.image) or rendered (export.pdf);
# an MPO (a camera's multi-picture JPEG) is opened as a JPEG and read as its first one.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "TIFF")
RASTER_FORMATS = frozenset({*ALLOWED_FORMATS, "MPO"})


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

        abp = abp_settings()
        # Pillow refuses more than its own MAX_IMAGE_PIXELS (with a warning we make an
        # error) in open() and crop(): past it, our clearer refusal comes first.
        pillow = Image.MAX_IMAGE_PIXELS
        pixels: int = abp.MAX_IMAGE_PIXELS
        return cls(
            input_bytes=abp.MAX_IMAGE_BYTES,
            pixels=pixels if pillow is None else min(pixels, pillow),
            dimension=abp.MAX_IMAGE_DIMENSION,
            output_bytes=abp.MAX_IMAGE_OUTPUT_BYTES,
        )
