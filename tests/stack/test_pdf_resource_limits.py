"""export.pdf's memory limits through the real stack: Daphne, Redis, a Celery worker.

Each document here grew a worker by about 1 GiB or more before the limits (see
bench/resource_bombs.py); each now comes back INVALID_PARAMS on `html`, and the
worker that refused it still renders the next document.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.agent import Agent
from tests.work.pdf.test_fetcher import MIB, data_url, png_header, woff2_bomb, woff_bomb


def export(agent: Agent, html: str) -> dict[str, Any]:
    payload: dict[str, Any] = agent.result_of(agent.call("export.pdf", {"html": html}), timeout=60)[
        "payload"
    ]
    return payload


def font_face(font: bytes) -> str:
    url = data_url("font/woff", font)
    return f"<style>@font-face {{ font-family: f; src: url({url}) }} p {{ font-family: f }}</style>"


@pytest.mark.parametrize(
    ("build", "limit"),
    [
        # 306 KB inflating to 300 MiB: 921 MiB of worker growth, and a success, before.
        (lambda: font_face(woff_bomb(inflating=True)) + "<p>x</p>", 8 * MIB),
        (lambda: font_face(woff2_bomb(inflating=True)) + "<p>x</p>", 8 * MIB),
        # 420 KB of PNG decoding to 12000x12000: 1.1 GiB before.
        (lambda: f'<img src="{data_url("image/png", png_header(12000, 12000, complete=True))}">',
         50_000_000),
        # html, head and body, and 49,998 paragraphs: one element over the limit.
        (lambda: "<p>x</p>" * 49_998, 50_000),
        (lambda: "<div>" * 63 + "x", 64),
    ],
    ids=["woff", "woff2", "png", "elements", "depth"],
)  # fmt: skip
def test_memory_bombs_are_invalid_params(agent: Agent, build: Any, limit: int) -> None:
    payload = export(agent, build())
    assert payload["success"] is False, payload
    error = payload["error"]
    assert error["code"] == "INVALID_PARAMS"
    assert error["details"]["path"] == "html"
    assert error["details"]["limit"] == limit
    assert len(error["message"]) < 300
    # The worker is still there, and still renders.
    assert export(agent, "<p>still here</p>")["data"]["pageCount"] == 1
