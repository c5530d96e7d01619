"""SafeURLFetcher: what it refuses, and how it fetches what it allows.

Loopback is forbidden, so the tests that need a real server (redirects, size,
timeout, success) serve from 127.0.0.1 and open the one seam meant for it:
`_is_forbidden_address`, patched to let loopback through.

The hostile resources (font and image bombs) are built here, small: what they
declare is what is refused. test_pdf, test_pdf_resource_limits and
bench/resource_bombs use the same builders.
"""

from __future__ import annotations

import base64
import io
import ipaddress
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import brotli  # type: ignore[import-untyped]
import pytest
from django.conf import settings
from django.test import override_settings
from fontTools.fontBuilder import FontBuilder  # type: ignore[import-untyped]
from fontTools.pens.ttGlyphPen import TTGlyphPen  # type: ignore[import-untyped]
from PIL import Image
from weasyprint.urls import FatalURLFetchingError

from capabilities.conf import abp_settings
from capabilities.work.pdf import fetcher
from capabilities.work.pdf.fetcher import (
    ResourceLimits,
    ResourceRefused,
    SafeURLFetcher,
    URLFetchFailed,
    URLNotAllowed,
    fetcher_from_settings,
    shorten_url,
)

MIB = 1024 * 1024


# --- Hostile (and harmless) resources -------------------------------------------------


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def woff(
    tables: Sequence[tuple[bytes, int, bytes]],
    *,
    sfnt_size: int | None = None,
    metadata: tuple[int, bytes] | None = None,
) -> bytes:
    """A WOFF font: (tag, origLength, stored data) per table; metadata (origLength, zlib)."""
    header_size, entry_size = 44, 20
    offset = header_size + entry_size * len(tables)
    entries, blobs = b"", b""
    for tag, orig_length, stored in tables:
        entries += struct.pack(">4sLLLL", tag, offset + len(blobs), len(stored), orig_length, 0)
        blobs += stored + b"\0" * (-len(stored) % 4)
    meta_offset = offset + len(blobs)
    meta_orig, meta = metadata or (0, b"")
    declared = sum(orig for _, orig, _ in tables) if sfnt_size is None else sfnt_size
    header = struct.pack(
        ">4s4sLHHLHHLLLLL",
        *(b"wOFF", b"\0\1\0\0", meta_offset + len(meta), len(tables), 0, declared, 1, 0),
        *(meta_offset if meta else 0, len(meta), meta_orig, 0, 0),
    )
    return header + entries + blobs + meta


def zlib_zeros(size: int) -> bytes:
    """A zlib stream of `size` zero bytes, compressed a chunk at a time."""
    compressor = zlib.compressobj(9)
    chunk = b"\0" * MIB
    parts = [compressor.compress(chunk[: min(MIB, size - done)]) for done in range(0, size, MIB)]
    return b"".join(parts) + compressor.flush()


def brotli_zeros(size: int) -> bytes:
    """A Brotli stream of `size` zero bytes, compressed a chunk at a time."""
    compressor = brotli.Compressor(quality=1)
    chunk = b"\0" * MIB
    parts = [compressor.process(chunk[: min(MIB, size - done)]) for done in range(0, size, MIB)]
    stream: bytes = b"".join(parts) + compressor.finish()
    return stream


def woff_bomb(declared: int = 300 * MIB, *, inflating: bool = False) -> bytes:
    """A WOFF whose one table declares `declared` bytes.

    Its stream is a few bytes, or (`inflating`) one that does inflate to that size:
    the real attack, about 1/1000 of `declared`.
    """
    stream = zlib_zeros(declared) if inflating else zlib.compress(b"\0" * 1000)
    return woff([(b"cmap", declared, stream)])


def _base128(value: int) -> bytes:
    digits = [value & 0x7F]
    while value := value >> 7:
        digits.append(0x80 | (value & 0x7F))
    return bytes(reversed(digits))


def woff2(tables: Sequence[tuple[int, int]], stream: bytes, *, sfnt_size: int = 0) -> bytes:
    """A WOFF2 font: (known-tag index, origLength) per untransformed table, one stream."""
    # Bits 6-7 zero: no transform (for tables other than glyf and loca).
    directory = b"".join(bytes([index]) + _base128(orig) for index, orig in tables)
    length = 48 + len(directory) + len(stream)
    declared = sfnt_size or sum(orig for _, orig in tables)
    header = struct.pack(
        ">4s4sLHHLLHHLLLLL",
        *(b"wOF2", b"\0\1\0\0", length, len(tables), 0, declared, len(stream)),
        *(1, 0, 0, 0, 0, 0, 0),
    )
    return header + directory + stream


def woff2_bomb(declared: int = 300 * MIB, *, inflating: bool = False) -> bytes:
    """A WOFF2 whose 'cmap' table (known tag 0) declares `declared` bytes (see woff_bomb)."""
    stream = brotli_zeros(declared) if inflating else brotli.compress(b"\0" * 1000)
    return woff2([(0, declared)], stream)


def real_font(flavor: str | None) -> bytes:
    """A tiny real font (one glyph, for 'x'): TrueType, or as WOFF or WOFF2."""
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder([".notdef", "x"])
    builder.setupCharacterMap({ord("x"): "x"})
    pen = TTGlyphPen(None)
    pen.moveTo((0, 0))
    pen.lineTo((500, 0))
    pen.lineTo((500, 500))
    pen.closePath()
    builder.setupGlyf({".notdef": TTGlyphPen(None).glyph(), "x": pen.glyph()})
    builder.setupHorizontalMetrics({".notdef": (500, 0), "x": (600, 0)})
    builder.setupHorizontalHeader(ascent=800, descent=-200)
    builder.setupNameTable({"familyName": "Tiny", "styleName": "Regular"})
    builder.setupOS2()
    builder.setupPost()
    builder.font.flavor = flavor
    buffer = io.BytesIO()
    builder.font.save(buffer)
    return buffer.getvalue()


def png_header(width: int, height: int, *, bit_depth: int = 8, complete: bool = False) -> bytes:
    """An RGB PNG announcing width x height black pixels.

    Its data is one row (identified, never decoded), or (`complete`) every row: the
    real attack, about 1/1000 of what it decodes to.
    """
    row = b"\0" * (1 + width * 3 * bit_depth // 8)
    compressor = zlib.compressobj(9)
    rows = (compressor.compress(row) for _ in range(height if complete else 1))
    idat = b"".join(rows) + compressor.flush()
    ihdr = struct.pack(">LLBBBBB", width, height, bit_depth, 2, 0, 0, 0)
    chunks = _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data)
    return struct.pack(">L", len(data)) + kind + data + struct.pack(">L", crc)


def image(kind: str, size: tuple[int, int] = (20, 10), mode: str = "RGB") -> bytes:
    """A small image saved by Pillow in `kind` (PNG, JPEG, BMP, ICO, ...)."""
    if kind == "ICO":
        size = (16, 16)  # Pillow before 13 writes no icon at all for a size not square
    buffer = io.BytesIO()
    Image.new(mode, size, 128).save(buffer, kind)
    return buffer.getvalue()


# --- The fetcher ------------------------------------------------------------------------


@dataclass
class Route:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/plain"})
    body: bytes = b"hello"
    # Send the body without Content-Length, the end marked by closing the connection.
    close_delimited: bool = False
    # Wait this long (or until the test ends) before answering.
    delay: float = 0.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]
    requests: list[tuple[str, str]]
    released: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves the handler writing to a closed socket.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.requests.append((self.path, self.headers.get("Host", "")))
        route = self.server.routes.get(self.path, Route(status=404, body=b""))
        if route.delay:
            self.server.released.wait(route.delay)
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        if not route.close_delimited:
            self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        self.wfile.write(route.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    """A local HTTP server on 127.0.0.1; its `routes` say what each path answers."""
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.routes, httpd.requests, httpd.released = {}, [], threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.released.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open the address seam for loopback only, so the local server is reachable."""
    original = fetcher._is_forbidden_address
    monkeypatch.setattr(
        fetcher,
        "_is_forbidden_address",
        lambda address: not address.is_loopback and original(address),
    )


def resolve_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> list[str]:
    """Make every DNS lookup answer `addresses`; returns the list of names looked up."""
    looked_up: list[str] = []

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        looked_up.append(host)
        results: list[Any] = []
        for address in addresses:
            if ipaddress.ip_address(address).version == 6:
                results.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                results.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return results

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return looked_up


def make(
    hosts: list[str],
    *,
    timeout: float = 2.0,
    max_bytes: int = 1000,
    font_bytes: int = 8 * MIB,
    pixels: int = 50_000_000,
    total_bytes: int = 128 * MIB,
) -> SafeURLFetcher:
    limits = ResourceLimits(font_bytes=font_bytes, pixels=pixels, total_bytes=total_bytes)
    return SafeURLFetcher(allowed_hosts=hosts, timeout=timeout, max_bytes=max_bytes, limits=limits)


def refused(fetch: SafeURLFetcher, url: str) -> ResourceRefused:
    """Fetch `url`, expecting ResourceRefused; the error."""
    with pytest.raises(ResourceRefused) as caught:
        fetch.fetch(url)
    return caught.value


def test_errors_stop_the_render() -> None:
    assert issubclass(URLNotAllowed, FatalURLFetchingError)
    assert issubclass(URLFetchFailed, FatalURLFetchingError)
    error = URLNotAllowed("file:///x", "no")
    assert (error.url, error.reason) == ("file:///x", "no")


def test_data_url_is_decoded() -> None:
    response = make([]).fetch("data:text/plain;base64,aGVsbG8=")
    assert response.read() == b"hello"
    assert response.content_type == "text/plain"


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "ftp://example.com/file.png",
        "gopher://example.com/",
        "javascript:alert(1)",
    ],
)
def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(URLNotAllowed) as caught:
        make(["example.com"]).fetch(url)
    assert caught.value.url == url
    assert "scheme" in caught.value.reason


@pytest.mark.parametrize(
    ("hosts", "url"),
    [
        ([], "http://example.com/a.png"),
        (["example.com"], "https://example.org/a.png"),
        (["example.com"], "http://sub.example.com/a.png"),
        (["example.com"], "http://example.com.evil.test/a.png"),
    ],
)
def test_hosts_outside_the_allow_list_are_refused_before_any_lookup(
    monkeypatch: pytest.MonkeyPatch, hosts: list[str], url: str
) -> None:
    looked_up = resolve_to(monkeypatch, "93.184.215.14")
    with pytest.raises(URLNotAllowed, match="allow-list"):
        make(hosts).fetch(url)
    assert looked_up == []


def test_localhost_is_refused_even_when_allow_listed() -> None:
    with pytest.raises(URLNotAllowed, match="non-public"):
        make(["localhost"]).fetch("http://localhost/x.png")


@pytest.mark.parametrize(
    "addresses",
    [
        ("127.0.0.1",),
        ("10.0.0.1",),
        ("172.16.5.4",),
        ("192.168.1.1",),
        ("100.64.0.1",),
        ("169.254.169.254",),
        ("0.0.0.0",),
        ("224.0.0.1",),
        ("::1",),
        ("::ffff:127.0.0.1",),
        ("fe80::1",),
        ("fd00:ec2::254",),
        ("ff0e::1",),
        # Any one bad address is enough.
        ("93.184.215.14", "10.0.0.1"),
    ],
)
def test_hosts_resolving_to_internal_addresses_are_refused(
    monkeypatch: pytest.MonkeyPatch, addresses: tuple[str, ...]
) -> None:
    resolve_to(monkeypatch, *addresses)
    with pytest.raises(URLNotAllowed, match="non-public"):
        make(["images.example.com"]).fetch("https://images.example.com/a.png")


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"])
def test_public_addresses_are_not_forbidden(address: str) -> None:
    assert not fetcher._is_forbidden_address(ipaddress.ip_address(address))


def test_a_name_that_does_not_resolve_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(URLFetchFailed, match="resolve"):
        make(["nowhere.example"]).fetch("http://nowhere.example/")


@pytest.mark.usefixtures("allow_loopback")
def test_fetches_an_allowed_url(server: _Server) -> None:
    server.routes["/a.css?v=1"] = Route(headers={"Content-Type": "text/css"}, body=b"p{}")
    port = server.server_address[1]
    response = make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{port}/a.css?v=1#frag")
    assert response.read() == b"p{}"
    assert response.content_type == "text/css"
    assert server.requests == [("/a.css?v=1", f"127.0.0.1:{port}")]


@pytest.mark.usefixtures("allow_loopback")
def test_connects_to_the_checked_address_without_resolving_again(
    monkeypatch: pytest.MonkeyPatch, server: _Server
) -> None:
    # A rebinding DNS would answer differently the second time: there is no second time.
    looked_up = resolve_to(monkeypatch, "127.0.0.1")
    server.routes["/x"] = Route()
    port = server.server_address[1]
    assert make(["cdn.example.com"]).fetch(f"http://cdn.example.com:{port}/x").read() == b"hello"
    assert looked_up == ["cdn.example.com"]
    assert server.requests == [("/x", f"cdn.example.com:{port}")]


@pytest.mark.usefixtures("allow_loopback")
def test_redirects_are_refused(server: _Server) -> None:
    server.routes["/r"] = Route(status=302, headers={"Location": "http://169.254.169.254/"})
    port = server.server_address[1]
    with pytest.raises(URLNotAllowed, match="redirect"):
        make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{port}/r")
    assert [path for path, _ in server.requests] == ["/r"]


@pytest.mark.usefixtures("allow_loopback")
@pytest.mark.parametrize("close_delimited", [False, True])
def test_bodies_over_max_bytes_fail(server: _Server, close_delimited: bool) -> None:
    server.routes["/big"] = Route(body=b"x" * 1001, close_delimited=close_delimited)
    server.routes["/fits"] = Route(body=b"x" * 1000, close_delimited=close_delimited)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with pytest.raises(URLFetchFailed, match="larger than 1000 bytes"):
        make(["127.0.0.1"], max_bytes=1000).fetch(f"{base}/big")
    assert len(make(["127.0.0.1"], max_bytes=1000).fetch(f"{base}/fits").read()) == 1000


@pytest.mark.usefixtures("allow_loopback")
def test_http_errors_fail(server: _Server) -> None:
    with pytest.raises(URLFetchFailed, match="HTTP 404"):
        make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{server.server_address[1]}/missing")


@pytest.mark.usefixtures("allow_loopback")
def test_slow_servers_time_out(server: _Server) -> None:
    # The server answers after a minute, or when the test ends (it never waits for it).
    server.routes["/slow"] = Route(delay=60.0)
    started = time.monotonic()
    with pytest.raises(URLFetchFailed, match=r"timed out|took longer than 0\.2 s"):
        make(["127.0.0.1"], timeout=0.2).fetch(f"http://127.0.0.1:{server.server_address[1]}/slow")
    # Gave up long before the server answered (no tight bound: a loaded machine may wake
    # the thread late).
    assert time.monotonic() - started < 30


def test_fetcher_from_settings_reads_abp_settings() -> None:
    limits = {
        "URL_FETCH_ALLOWED_HOSTS": ["CDN.example.com"],
        "URL_FETCH_TIMEOUT_SECONDS": 1.5,
        "URL_FETCH_MAX_BYTES": 42,
        "MAX_FONT_BYTES": 43,
        "MAX_IMAGE_PIXELS": 44,
        "MAX_PDF_RESOURCE_BYTES": 45,
    }
    with override_settings(ABP={**settings.ABP, **limits}):
        configured = fetcher_from_settings()
    assert configured.allowed_hosts == frozenset({"cdn.example.com"})
    assert (configured.timeout, configured.max_bytes) == (1.5, 42)
    assert configured.limits == ResourceLimits(font_bytes=43, pixels=44, total_bytes=45)
    assert configured.resource_bytes == 0


def test_the_pixel_limit_is_capped_by_pillows_own() -> None:
    with override_settings(ABP={**settings.ABP, "MAX_IMAGE_PIXELS": 10**12}):
        assert fetcher_from_settings().limits.pixels == Image.MAX_IMAGE_PIXELS


def test_the_default_allow_list_is_empty() -> None:
    assert abp_settings().URL_FETCH_ALLOWED_HOSTS == ()
    with pytest.raises(URLNotAllowed):
        fetcher_from_settings().fetch("https://example.com/")


# --- What resources become once decoded ---------------------------------------------


@pytest.mark.parametrize(
    ("font", "limit"),
    [
        (woff_bomb(), 8 * MIB),
        # The table fits; the whole does not.
        (woff([(b"cmap", 5 * MIB, b"x" * 10), (b"glyf", 5 * MIB, b"x" * 10)]), 8 * MIB),
        (woff([(b"cmap", 100, b"x" * 100)], sfnt_size=300 * MIB), 8 * MIB),
        (woff([(b"cmap", 100, b"x" * 100)], metadata=(300 * MIB, zlib.compress(b"<m/>"))), 8 * MIB),
        (woff2_bomb(), 8 * MIB),
        (woff2([(0, 1000)], brotli.compress(b"\0" * 1000), sfnt_size=300 * MIB), 8 * MIB),
    ],
    ids=[
        "woff-table",
        "woff-sum",
        "woff-sfnt-size",
        "woff-metadata",
        "woff2-table",
        "woff2-sfnt-size",
    ],
)
def test_fonts_declaring_too_much_are_refused(font: bytes, limit: int) -> None:
    fetch = make([], max_bytes=MIB)
    error = refused(fetch, data_url("font/woff", font))
    assert error.limit == limit
    assert "declaring" in error.reason
    assert fetch.resource_bytes == 0
    assert fetch.failure is error


@pytest.mark.parametrize(
    "font",
    [
        # Declaring 1000 bytes, inflating to 100 KB: fontTools would inflate it all first.
        woff([(b"cmap", 1000, zlib.compress(b"\0" * 100_000))]),
        woff([(b"cmap", 100, b"x" * 100)], metadata=(1000, zlib.compress(b"\0" * 100_000))),
        woff2([(0, 1000)], brotli.compress(b"\0" * 100_000)),
    ],
    ids=["woff-table", "woff-metadata", "woff2"],
)
def test_fonts_inflating_to_more_than_they_declare_are_refused(font: bytes) -> None:
    error = refused(make([], max_bytes=MIB), data_url("font/woff2", font))
    assert "inflates to more than" in error.reason


@pytest.mark.parametrize(
    "font",
    [b"wOFF" + b"\0" * 10, b"wOF2\0\1\0\0", woff2_bomb()[:60]],
    ids=["woff-header", "woff2-header", "woff2-directory"],
)
def test_damaged_fonts_are_refused(font: bytes) -> None:
    error = refused(make([], max_bytes=MIB), data_url("font/woff", font))
    assert "damaged font" in error.reason or "declaring" in error.reason


@pytest.mark.parametrize("mime", ["text/css", "image/png", "application/octet-stream"])
def test_fonts_are_known_by_their_magic_not_their_type(mime: str) -> None:
    refused(make([], max_bytes=MIB), data_url(mime, woff_bomb()))


@pytest.mark.usefixtures("allow_loopback")
def test_fetched_fonts_and_images_are_checked_too(server: _Server) -> None:
    server.routes["/font"] = Route(headers={"Content-Type": "text/plain"}, body=woff_bomb())
    server.routes["/image"] = Route(
        headers={"Content-Type": "text/css"}, body=png_header(12000, 12000)
    )
    base = f"http://127.0.0.1:{server.server_address[1]}"
    fetch = make(["127.0.0.1"])
    assert refused(fetch, f"{base}/font").limit == 8 * MIB
    assert refused(fetch, f"{base}/image").limit == 50_000_000


@pytest.mark.parametrize("flavor", [None, "woff", "woff2"])
def test_real_fonts_pass_and_count_what_they_declare(flavor: str | None) -> None:
    font = real_font(flavor)
    fetch = make([], max_bytes=MIB)
    assert fetch.fetch(data_url("font/woff", font)).read() == font
    # The decompressed size is the TrueType font's, give or take table padding.
    assert abs(fetch.resource_bytes - len(real_font(None))) < 64


@pytest.mark.parametrize(
    "png",
    [
        png_header(12000, 12000),
        png_header(12000, 12000, bit_depth=16),
        # Past twice Pillow's own limit, where Pillow raises instead of warning.
        png_header(20000, 20000),
    ],
    ids=["png-8", "png-16", "png-past-pillow"],
)
def test_images_over_the_pixel_limit_are_refused(png: bytes) -> None:
    fetch = make([], max_bytes=MIB)
    error = refused(fetch, data_url("image/png", png))
    assert error.limit == 50_000_000
    assert fetch.resource_bytes == 0


def test_the_pixel_limit_is_process_images() -> None:
    fetch = make([], pixels=199)
    assert refused(fetch, data_url("image/png", image("PNG", (20, 10)))).limit == 199
    assert make([], pixels=200).fetch(data_url("image/png", image("PNG", (20, 10))))


@pytest.mark.parametrize(
    ("kind", "mode"), [("BMP", "RGB"), ("ICO", "RGB"), ("TGA", "RGB"), ("PPM", "RGB"), ("XBM", "1")]
)
def test_raster_formats_outside_the_allow_list_are_refused(kind: str, mode: str) -> None:
    error = refused(make([], max_bytes=MIB), data_url("image/png", image(kind, mode=mode)))
    assert kind in error.reason
    assert error.limit is None


def webp(encoding: str, size: tuple[int, int] = (20, 10)) -> bytes:
    """A WebP whose first chunk is `encoding`: VP8 (lossy), VP8L (lossless), VP8X (extended)."""
    buffer = io.BytesIO()
    mode = "RGBA" if encoding == "VP8X" else "RGB"
    Image.new(mode, size, (1, 2, 3, 4)[: len(mode)]).save(
        buffer, "WEBP", lossless=encoding == "VP8L"
    )
    data = buffer.getvalue()
    assert data[12:16] == encoding.ljust(4).encode()
    return data


def animated_webp_canvas(width: int, height: int) -> bytes:
    """An animated WebP of two 16x16 frames on a width x height canvas."""
    frames = [Image.new("RGB", (16, 16), (0, 0, 0)), Image.new("RGB", (16, 16), (255, 0, 0))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:])
    data = bytearray(buffer.getvalue())
    assert data[12:16] == b"VP8X"
    data[24:27], data[27:30] = (width - 1).to_bytes(3, "little"), (height - 1).to_bytes(3, "little")
    return bytes(data)


@pytest.mark.parametrize("encoding", ["VP8", "VP8L", "VP8X"])
def test_webp_sizes_are_read_before_pillow_opens_them(
    monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    url = data_url("image/webp", webp(encoding))
    fetch = make([], max_bytes=MIB, pixels=200)
    assert fetch.fetch(url)
    assert fetch.resource_bytes == 800

    # Pillow opens WebP with libwebp's animation decoder, which reserves the canvas.
    def open_image(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Pillow must not open it")

    monkeypatch.setattr(Image, "open", open_image)
    assert refused(make([], max_bytes=MIB, pixels=199), url).limit == 199
    canvas = data_url("image/webp", animated_webp_canvas(12000, 12000))
    error = refused(make([], max_bytes=MIB), canvas)
    assert "12000x12000" in error.reason


def mpo(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    first, second = Image.new("RGB", size), Image.new("RGB", size)
    first.save(buffer, "MPO", save_all=True, append_images=[second])
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["PNG", "JPEG", "GIF", "WEBP", "TIFF", "MPO"])
def test_allowed_images_count_four_bytes_a_pixel(kind: str) -> None:
    data = mpo((200, 100)) if kind == "MPO" else image(kind, (200, 100))
    assert Image.open(io.BytesIO(data)).format == kind
    assert len(data) < 200 * 100 * 4
    fetch = make([], max_bytes=MIB)
    assert fetch.fetch(data_url("image/x", data)).read() == data
    assert fetch.resource_bytes == 200 * 100 * 4


@pytest.mark.parametrize(
    "data",
    [
        b"p { color: red }",
        b'<svg xmlns="http://www.w3.org/2000/svg" width="12000" height="12000"/>',
        b"\n\n/* a comment */ @font-face { font-family: x }",
        real_font(None),
    ],
    ids=["css", "svg", "css-comment", "truetype"],
)
def test_everything_else_counts_by_its_length(data: bytes) -> None:
    fetch = make([], max_bytes=MIB)
    assert fetch.fetch(data_url("text/css", data)).read() == data
    assert fetch.resource_bytes == len(data)


def test_a_small_image_in_a_large_file_counts_its_length() -> None:
    png = image("PNG", (1, 1))
    padded = png[:-12] + _png_chunk(b"prVt", b"x" * 100_000) + png[-12:]
    fetch = make([], max_bytes=MIB)
    assert fetch.fetch(data_url("image/png", padded)).read() == padded
    assert fetch.resource_bytes == len(padded)


def test_the_budget_bounds_all_resources_of_a_render() -> None:
    fetch = make([], total_bytes=2000)
    fetch.fetch(data_url("image/png", image("PNG")))
    fetch.fetch(data_url("text/css", b"x" * 1000))
    assert fetch.resource_bytes == 1800
    error = refused(fetch, data_url("image/gif", image("GIF")))
    assert error.limit == 2000
    assert "2600 bytes once decoded, over 2000" in error.reason
    # Every fetch counts, the same URL fetched again too.
    fresh = make([], total_bytes=2000)
    fresh.fetch(data_url("image/png", image("PNG")))
    fresh.fetch(data_url("image/png", image("PNG")))
    refused(fresh, data_url("image/png", image("PNG")))


def test_data_urls_are_bounded_like_fetched_bodies() -> None:
    assert make([], max_bytes=1000).fetch(data_url("text/css", b"x" * 1000)).read()
    error = refused(make([], max_bytes=1000), data_url("text/css", b"x" * 1001))
    assert error.limit == 1000


def test_messages_show_a_long_url_shortened() -> None:
    url = data_url("image/bmp", image("BMP", (400, 400)))
    assert len(url) > 100_000
    error = refused(make([], max_bytes=MIB), url)
    assert error.url == url
    assert len(str(error)) < 200
    assert str(error).startswith(url[:60] + "…: ")
    assert shorten_url("http://a.example/x") == "http://a.example/x"
