"""process.image of a 12 MP JPEG to 800x600: uploaded bytes + a reference, against in-process.

- through the stack with an upload: `POST /abp/uploads` (raw bytes, one keep-alive
  HTTP connection) then `process.image` naming the upload, over a real WebSocket
  (Daphne, Redis, a Celery worker); the upload is inside the timing;
- through the stack with inline base64 (what clients sent before uploads);
- the best in-process Pillow recipe (JPEG draft + reducing_gap, the runner's own);
- naive `Image.open().resize()` in-process.

Rounds alternate the four, so drift on this shared machine hits all of them.
Goal (issue 17): upload + call <= 1.2x the best recipe, and >= 2x faster than naive.
Run: .venv/bin/python bench/image_upload.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare(
    "abp-bench-upload-",
    ABP_MAX_FRAME_BYTES=str(32 * 1024 * 1024),
)

from bench import stats  # noqa: E402
from bench.common import best_resize, naive_resize, photo, through_stack, timed  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

OPERATIONS = [{"type": "resize", "width": 800, "height": 600, "fit": "fill"}]


def upload(connection: http.client.HTTPConnection, data: bytes, session: str) -> dict[str, Any]:
    """POST the bytes as an upload of the session; the reference."""
    headers = {
        "Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}",
        "ABP-Session": session,
        "Content-Type": "image/jpeg",
    }
    connection.request("POST", "/abp/uploads", body=data, headers=headers)
    response = connection.getresponse()
    body = response.read()
    assert response.status == 201, body
    reference: dict[str, Any] = json.loads(body)
    return reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    jpeg = photo()
    inline: dict[str, Any] = {
        "image": {"content": base64.b64encode(jpeg).decode(), "mimeType": "image/jpeg"},
        "operations": OPERATIONS,
        "format": "jpeg",
    }
    rows: dict[str, list[float]] = {}
    try:
        STACK.start()
        connection = http.client.HTTPConnection("127.0.0.1", STACK.web_port, timeout=60)
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            session = str(agent.session_id)

            def by_upload() -> None:
                reference = upload(connection, jpeg, session)
                params = {"image": reference, "operations": OPERATIONS, "format": "jpeg"}
                through_stack(agent, "process.image", params)

            by_upload()  # warm-up: the worker's first image, Daphne's first upload
            through_stack(agent, "process.image", inline)
            for _ in range(args.rounds):
                rows.setdefault("upload", []).append(timed(by_upload))
                rows.setdefault("post", []).append(timed(lambda: upload(connection, jpeg, session)))
                rows.setdefault("best", []).append(timed(lambda: best_resize(jpeg)))
                rows.setdefault("naive", []).append(timed(lambda: naive_resize(jpeg)))
                rows.setdefault("base64", []).append(
                    timed(lambda: through_stack(agent, "process.image", inline))
                )
        connection.close()
    finally:
        STACK.stop()
        STACK.remove_files()

    med = {key: statistics.median(values) for key, values in rows.items()}
    size_mb = len(jpeg) / 1e6
    print(f"\n== process.image: 12 MP JPEG ({size_mb:.2f} MB) to 800x600, {args.rounds} rounds")
    print(stats.line("naive Image.open + resize (in-process)", rows["naive"]))
    print(stats.line("best recipe, draft + reduce (in-process)", rows["best"]))
    print(stats.line("stack, upload + reference (vs best)", rows["upload"], med["best"]))
    print(stats.line("stack, inline base64 (vs best)", rows["base64"], med["best"]))
    print(stats.line("of which: the upload alone (POST)", rows["post"]))
    print(f"   upload + reference / best recipe: {med['upload'] / med['best']:.2f}x (goal <= 1.2x)")
    print(f"   naive / upload + reference:       {med['naive'] / med['upload']:.2f}x (goal >= 2x)")
    print(f"   inline base64 / upload + reference: {med['base64'] / med['upload']:.2f}x")


if __name__ == "__main__":
    main()
