"""What hostile documents cost an export.pdf worker: peak memory, time, outcome.

Each document runs through the export.pdf runner (in-memory context, no stack) in a
fresh child process, with its address space capped (RLIMIT_AS, 6 GiB by default) so
that a document that still explodes fails in the child, not on the host. The child
warms up (a small render with an image and a font), notes its peak RSS, renders the
document, and reports its peak RSS growth (`ru_maxrss` after minus before), the wall
time, and the outcome: success, the CapabilityError's code, or the exception.

- a WOFF font whose one table inflates to 300 MiB (306 KB), and the same as WOFF2;
- a 12000x12000 PNG, 8-bit (420 KB) and 16-bit (840 KB) per channel;
- 1.6 MB of `<p>x</p>` (200,000 elements);
- for scale: 49,997 `<p>x</p>` (the element limit, 50,000, with html, head and
  body), and a legitimate 500-page document of text.

Self-contained (its own builders), so it runs against any version of the runner:
    .venv/bin/python bench/resource_bombs.py [--only png8] [--address-space-gib 6]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def zeros(size: int, compressor: Any, finish: Callable[[], bytes]) -> bytes:
    chunk = b"\0" * MIB
    parts = [compressor(chunk[: min(MIB, size - done)]) for done in range(0, size, MIB)]
    return b"".join(parts) + finish()


def woff(declared: int) -> bytes:
    """A WOFF whose 'cmap' table inflates to `declared` zero bytes."""
    deflate = zlib.compressobj(9)
    stream = zeros(declared, deflate.compress, deflate.flush)
    stream += b"\0" * (-len(stream) % 4)
    entry = struct.pack(">4sLLLL", b"cmap", 64, len(stream), declared, 0)
    header = struct.pack(
        ">4s4sLHHLHHLLLLL", b"wOFF", b"\0\1\0\0", 64 + len(stream), 1, 0, declared + 12 + 16,
        1, 0, 0, 0, 0, 0, 0,
    )  # fmt: skip
    return header + entry + stream


def woff2(declared: int) -> bytes:
    """A WOFF2 whose 'cmap' table (known tag 0, untransformed) inflates to `declared`."""
    import brotli  # type: ignore[import-untyped]

    compressor = brotli.Compressor(quality=1)
    stream = zeros(declared, compressor.process, compressor.finish)
    digits = [declared & 0x7F]
    value = declared >> 7
    while value:
        digits.append(0x80 | (value & 0x7F))
        value >>= 7
    directory = bytes([0]) + bytes(reversed(digits))
    header = struct.pack(
        ">4s4sLHHLLHHLLLLL", b"wOF2", b"\0\1\0\0", 48 + len(directory) + len(stream), 1, 0,
        declared + 12 + 16, len(stream), 1, 0, 0, 0, 0, 0, 0,
    )  # fmt: skip
    return header + directory + stream


def png(width: int, height: int, bit_depth: int) -> bytes:
    """A complete RGB PNG of black pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">L", len(data)) + kind + data + struct.pack(">L", crc)

    row = b"\0" * (1 + width * 3 * bit_depth // 8)
    deflate = zlib.compressobj(9)
    idat = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    ihdr = struct.pack(">LLBBBBB", width, height, bit_depth, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def font_face(font: bytes) -> str:
    url = data_url("font/woff", font)
    style = f"@font-face {{ font-family: f; src: url({url}) }} p {{ font-family: f }}"
    return f"<style>{style}</style><p>x</p>"


def text_pages(pages: int) -> str:
    paragraph = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 12 + "</p>"
    return "".join(
        f"<section style='page-break-after: always'><h1>Section {n}</h1>{paragraph * 4}</section>"
        for n in range(pages)
    )


def image(data: bytes) -> str:
    return f'<img src="{data_url("image/png", data)}">'


CASES: dict[str, tuple[str, Callable[[], str]]] = {
    "woff": ("WOFF, a table inflating to 300 MiB", lambda: font_face(woff(300 * MIB))),
    "woff2": ("WOFF2, a table inflating to 300 MiB", lambda: font_face(woff2(300 * MIB))),
    "png8": ("PNG 12000x12000, 8-bit", lambda: image(png(12000, 12000, 8))),
    "png16": ("PNG 12000x12000, 16-bit", lambda: image(png(12000, 12000, 16))),
    "flood": ("1.6 MB of <p>x</p> (200,000 elements)", lambda: "<p>x</p>" * 200_000),
    "limit": ("49,997 <p>x</p> (at the element limit)", lambda: "<p>x</p>" * 49_997),
    "text500": ("500 pages of text (legitimate)", lambda: text_pages(500)),
}  # fmt: skip


def child(path: str, address_space: int) -> None:
    """Render the document in `path` once, after a warm-up; print the figures as JSON."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from capabilities.work.context import CapabilityError
    from capabilities.work.pdf import runner as pdf
    from tests.support.context import RecordingContext

    # Loads Pillow's PNG plugin, fontTools and WeasyPrint's caches, as a worker has.
    warm = font_face(b"") + image(png(8, 8, 8))
    pdf.run({"html": warm}, RecordingContext())
    html = Path(path).read_text()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    try:
        data = pdf.run({"html": html}, RecordingContext())
        outcome = f"success, {data['pageCount']} pages"
    except CapabilityError as error:
        limit = (error.details or {}).get("limit")
        outcome = error.code + ("" if limit is None else f" (limit {limit})")
    except BaseException as error:  # whatever it is, it is the figure
        outcome = type(error).__name__
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"growth_mib": (after - before) / 1024, "seconds": seconds, "outcome": outcome})
    )


def measure(html: str, address_space: int) -> dict[str, Any]:
    """The child's figures for one document (or how the child died)."""
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as file:
        file.write(html)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "abpsite.settings",
        "DJANGO_ENV": "development",
    }
    try:
        command = [sys.executable, __file__, "--child", file.name, str(address_space)]
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, env=env, timeout=900
        )
    except subprocess.TimeoutExpired:
        return {"growth_mib": float("nan"), "seconds": 900.0, "outcome": "timed out"}
    finally:
        os.unlink(file.name)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        outcome = f"child died ({done.returncode}): {tail[0][:80]}"
        return {"growth_mib": float("nan"), "seconds": float("nan"), "outcome": outcome}
    figures: dict[str, Any] = json.loads(lines[-1])
    return figures


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--address-space-gib", type=float, default=6.0)
    args = parser.parse_args()
    address_space = int(args.address_space_gib * 1024 * MIB)
    print(f"== export.pdf runner in a fresh child per document ({ROOT})")
    print(f"{'document':<42} {'input':>9} {'peak RSS growth':>16} {'wall':>8}  outcome")
    for name in args.only or CASES:
        label, build = CASES[name]
        html = build()
        figures = measure(html, address_space)
        print(
            f"{label:<42} {len(html) / 1e6:>7.2f}MB {figures['growth_mib']:>12.0f} MiB"
            f" {figures['seconds']:>7.1f}s  {figures['outcome']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
