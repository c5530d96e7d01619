"""What a document's resource would become in memory, read without decoding it.

WOFF and WOFF2 fonts are known by their magic bytes; what they declare (the font's
size, each table's, the metadata's) is read from the header and table directory.
fontTools inflates a stream whole before comparing it with what was declared, so
each stream is also inflated here, by a decompressor that stops one byte past the
declared size: a stream that keeps going is refused, and no more than the declared
size is ever held. Raster images are identified by Pillow from their header alone
(`Image.open` decodes nothing). Everything else (CSS, SVG, plain TrueType) becomes
what it is: its length.

Pure functions, no settings: the fetcher passes its limits in.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from PIL import Image, UnidentifiedImageError

from capabilities.work.raster import ALLOWED_FORMATS, RASTER_FORMATS

# A decoded pixel counted at its largest common mode, RGBA.
BYTES_PER_PIXEL = 4

_WOFF = b"wOFF"
_WOFF2 = b"wOF2"


class ResourceKind(StrEnum):
    """What a resource is, for what it costs."""

    FONT = "font"
    """A WOFF or WOFF2 font: counts by its declared decompressed size (or its length)."""
    IMAGE = "image"
    """A raster image: counts by its pixels, 4 bytes each (or its length)."""
    OTHER = "other"
    """Anything else (CSS, SVG, TrueType, ...): counts by its length."""


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """What a resource is and how many bytes it becomes once decoded."""

    kind: ResourceKind
    size: int


class Refused(Exception):
    """The resource must not be decoded; `reason` says why, `limit` which bound."""

    def __init__(self, reason: str, limit: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit


def footprint(data: bytes, *, font_bytes: int, pixels: int) -> Footprint:
    """What `data` becomes once decoded; Refused if over a limit or not a format read.

    `font_bytes` bounds a font's declared sizes, `pixels` a raster image's.
    """
    # Never less than the length: WeasyPrint keeps an image's bytes for the PDF, and a
    # tiny image can come in a large file.
    if data[:4] in (_WOFF, _WOFF2):
        size = max(font_size(data, font_bytes), len(data))
        return Footprint(kind=ResourceKind.FONT, size=size)
    image = image_pixels(data, pixels)
    if image is not None:
        size = max(image * BYTES_PER_PIXEL, len(data))
        return Footprint(kind=ResourceKind.IMAGE, size=size)
    return Footprint(kind=ResourceKind.OTHER, size=len(data))


def image_pixels(data: bytes, max_pixels: int) -> int | None:
    """The pixels of a raster image, read from its header; None if it is not one."""
    webp = _webp_size(data)
    # Pillow opens a WebP with libwebp's animation decoder, which reserves two
    # canvases (8 bytes a pixel) before any size is checked: its size comes first.
    if webp is not None:
        _check_pixels(webp, max_pixels)
    try:
        with warnings.catch_warnings():
            # Pillow only warns between its limit and twice that: a refusal here too.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise Refused(f"an image of more than {max_pixels} pixels", max_pixels) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, IndexError):
        # Not an image Pillow can open: WeasyPrint cannot decode it either.
        return None
    with image:
        kind, (width, height) = image.format or "unknown", image.size
    if kind not in RASTER_FORMATS:
        accepted = ", ".join(ALLOWED_FORMATS)
        raise Refused(f"a {kind} image; the image formats accepted are {accepted}")
    return _check_pixels((width, height), max_pixels)


def _check_pixels(size: tuple[int, int], max_pixels: int) -> int:
    width, height = size
    if width * height > max_pixels:
        raise Refused(f"an image of {width}x{height} pixels, over {max_pixels}", max_pixels)
    return width * height


def _webp_size(data: bytes) -> tuple[int, int] | None:
    """A WebP's canvas size from its first chunk (RFC 9649), or None if not a WebP."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk = data[12:16]
    if chunk == b"VP8X":
        # Canvas width and height minus one, 24 bits each, little-endian.
        width = int.from_bytes(data[24:27], "little") + 1
        return width, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8L":
        # After the signature byte: width and height minus one, 14 bits each.
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        # After the frame tag and start code: 14-bit width and height (2 bits of scale).
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def font_size(data: bytes, max_bytes: int) -> int:
    """The bytes a WOFF or WOFF2 font declares it decompresses to, once checked.

    Refused if a declared size is over `max_bytes`, if a stream inflates to more
    than it declares, or if the header cannot be read (fontTools could not either).
    """
    from fontTools.ttLib import TTLibError  # type: ignore[import-untyped]

    try:
        if data[:4] == _WOFF:
            return _woff_size(data, max_bytes)
        return _woff2_size(data, max_bytes)
    except (TTLibError, struct.error, ValueError, IndexError) as error:
        raise Refused(f"a damaged font ({error})") from None


@dataclass(frozen=True, kw_only=True)
class _Header:
    """The fields of a WOFF or WOFF2 header that say how much it inflates to."""

    tables: int
    sfnt_size: int
    compressed_size: int
    meta_offset: int
    meta_length: int
    meta_orig_length: int

    @classmethod
    def unpack(cls, layout: str, data: bytes) -> _Header:
        from fontTools.misc import sstruct  # type: ignore[import-untyped]

        fields: dict[str, int] = sstruct.unpack(layout, data[: sstruct.calcsize(layout)])
        return cls(
            tables=fields["numTables"],
            sfnt_size=fields["totalSfntSize"],
            compressed_size=fields.get("totalCompressedSize", 0),  # WOFF2 only
            meta_offset=fields["metaOffset"],
            meta_length=fields["metaLength"],
            meta_orig_length=fields["metaOrigLength"],
        )


def _woff_size(data: bytes, max_bytes: int) -> int:
    from fontTools.ttLib.sfnt import (  # type: ignore[import-untyped]
        WOFFDirectoryEntry,
        woffDirectoryFormat,
    )

    header, tables, _ = _directory(data, woffDirectoryFormat, WOFFDirectoryEntry)
    for entry in tables:
        _within(entry.origLength, max_bytes, f"WOFF font's {_tag(entry)} table")
    declared = max(header.sfnt_size, sum(entry.origLength for entry in tables))
    size = _within(declared + header.meta_orig_length, max_bytes, "WOFF font")
    for entry in tables:
        # fontTools takes a table stored whole (length == origLength) as it is.
        if entry.length < entry.origLength:
            stream = data[entry.offset : entry.offset + entry.length]
            _inflates_within(stream, entry.origLength, _inflate_zlib, f"{_tag(entry)} table")
    _check_metadata(data, header, _inflate_zlib)
    return size


def _woff2_size(data: bytes, max_bytes: int) -> int:
    from fontTools.ttLib.woff2 import (  # type: ignore[import-untyped]
        WOFF2DirectoryEntry,
        woff2DirectoryFormat,
    )

    header, tables, end = _directory(data, woff2DirectoryFormat, WOFF2DirectoryEntry)
    for entry in tables:
        _within(entry.origLength, max_bytes, f"WOFF2 font's {_tag(entry)} table")
        # `length` is a transformed table's transformLength, else its origLength.
        _within(entry.length, max_bytes, f"WOFF2 font's transformed {_tag(entry)} table")
    streamed = sum(entry.length for entry in tables)
    declared = max(header.sfnt_size, sum(entry.origLength for entry in tables), streamed)
    size = _within(declared + header.meta_orig_length, max_bytes, "WOFF2 font")
    # One Brotli stream holds every table, right after the directory: where fontTools
    # reads it, whatever the flavor says (a collection's directory is not skipped).
    stream = data[end : end + header.compressed_size]
    _inflates_within(stream, streamed, _inflate_brotli, "table data")
    _check_metadata(data, header, _inflate_brotli)
    return size


def _directory(data: bytes, layout: str, entry_class: Any) -> tuple[_Header, list[Any], int]:
    """The header, the directory's entries as fontTools' readers read them, and its end."""
    from fontTools.misc import sstruct

    header = _Header.unpack(layout, data)
    source = io.BytesIO(data)
    source.seek(sstruct.calcsize(layout))
    tables: list[Any] = []
    for _ in range(header.tables):
        entry = entry_class()
        entry.fromFile(source)
        tables.append(entry)
    return header, tables, source.tell()


class _Corrupt(Exception):
    """A stream that cannot be inflated."""


# Inflates a stream to about `limit` bytes at most, or raises _Corrupt.
_Inflate = Callable[[bytes, int], bytes]


def _inflate_zlib(stream: bytes, limit: int) -> bytes:
    try:
        return zlib.decompressobj().decompress(stream, limit)
    except zlib.error as error:
        raise _Corrupt from error


def _inflate_brotli(stream: bytes, limit: int) -> bytes:
    import brotli  # type: ignore[import-untyped]

    try:
        # The output stops growing once it reaches the limit (Brotli >= 1.2).
        inflated: bytes = brotli.Decompressor().process(stream, output_buffer_limit=limit)
    except brotli.error as error:
        raise _Corrupt from error
    return inflated


def _inflates_within(stream: bytes, declared: int, inflate: _Inflate, what: str) -> None:
    """Refuse a stream that inflates to more than it declares."""
    try:
        inflated = len(inflate(stream, declared + 1))
    except _Corrupt:
        # Corrupt before the declared size: fontTools stops at the same place.
        return
    if inflated > declared:
        raise Refused(f"a font whose {what} inflates to more than the {declared} bytes declared")


def _check_metadata(data: bytes, header: _Header, inflate: _Inflate) -> None:
    if header.meta_length:
        stream = data[header.meta_offset : header.meta_offset + header.meta_length]
        _inflates_within(stream, header.meta_orig_length, inflate, "metadata")


def _within(size: int, max_bytes: int, what: str) -> int:
    if size > max_bytes:
        raise Refused(f"a {what} declaring {size} bytes decompressed, over {max_bytes}", max_bytes)
    return size


def _tag(entry: Any) -> str:
    return repr(str(entry.tag))
