"""Capabilities through the whole stack against the same work done in-process.

- export.pdf of 10 and 50 pages, over a real WebSocket (Daphne, Redis, a Celery
  worker), against the same WeasyPrint call in this process;
- process.image resizing a 12 MP JPEG to 800x600 through the stack, against the
  best in-process Pillow recipe (JPEG draft + reducing_gap, the runner's own) and
  against a naive open + resize.

Runs alternate (stack, in-process, ...) so drift on this shared machine hits both.
Run: .venv/bin/python bench/capabilities_speed.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare(
    "abp-bench-caps-",
    ABP_INLINE_RESULT_MAX_BYTES=str(64 * 1024 * 1024),
    ABP_MAX_FRAME_BYTES=str(32 * 1024 * 1024),
)

from bench import stats  # noqa: E402
from bench.common import (  # noqa: E402
    best_resize,
    document,
    naive_resize,
    photo,
    render_locally,
    through_stack,
    timed,
)
from capabilities.work.pdf import runner as pdf  # noqa: E402
from tests.support.agent import Agent  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    jpeg = photo()
    image_params: dict[str, Any] = {
        "image": {"content": base64.b64encode(jpeg).decode(), "mimeType": "image/jpeg",
                  "encoding": "base64"},
        "operations": [{"type": "resize", "width": 800, "height": 600, "fit": "fill"}],
        "format": "jpeg",
    }  # fmt: skip
    rows: dict[str, list[float]] = {}
    try:
        STACK.start()
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            for pages in (10, 50):
                html = document(pages)
                through_stack(agent, "export.pdf", {"html": html})  # warm-up
                pdf.warm_up()
                for _ in range(args.rounds):
                    rows.setdefault(f"pdf{pages}-stack", []).append(
                        timed(partial(through_stack, agent, "export.pdf", {"html": html}))
                    )
                    rows.setdefault(f"pdf{pages}-local", []).append(
                        timed(partial(render_locally, html))
                    )
            through_stack(agent, "process.image", image_params)
            for _ in range(args.rounds * 2):
                rows.setdefault("img-stack", []).append(
                    timed(lambda: through_stack(agent, "process.image", image_params))
                )
                rows.setdefault("img-best", []).append(timed(lambda: best_resize(jpeg)))
                rows.setdefault("img-naive", []).append(timed(lambda: naive_resize(jpeg)))
    finally:
        STACK.stop()
        STACK.remove_files()

    med = {key: statistics.median(values) for key, values in rows.items()}
    print(f"\n== export.pdf through the stack vs WeasyPrint in-process ({args.rounds} rounds)")
    for pages in (10, 50):
        print(stats.line(f"{pages} pages, in-process write_pdf()", rows[f"pdf{pages}-local"]))
        print(stats.line(f"{pages} pages, through the stack", rows[f"pdf{pages}-stack"],
                         med[f"pdf{pages}-local"]))  # fmt: skip
    print(f"\n== process.image: 12 MP JPEG ({len(jpeg) / 1e6:.1f} MB) to 800x600")
    print(stats.line("naive Image.open + resize (in-process)", rows["img-naive"]))
    print(stats.line("best recipe, draft + reduce (in-process)", rows["img-best"]))
    print(stats.line("through the stack (vs best recipe)", rows["img-stack"], med["img-best"]))
    print(f"   naive / through the stack: {med['img-naive'] / med['img-stack']:.2f}x")


if __name__ == "__main__":
    main()
