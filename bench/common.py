"""Helpers more than one benchmark uses: inputs, in-process baselines, a bare Celery worker.

Import it after `environment.prepare` (it imports the capabilities' own code).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import weasyprint
from PIL import Image

from capabilities.work.images import runner as images
from tests.support.agent import Agent
from tests.support.stack import ManagedProcess, python_tool


def timed(work: Callable[[], object]) -> float:
    """How long `work()` takes, in ms."""
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1000


def through_stack(agent: Agent, capability: str, params: dict[str, Any]) -> None:
    """One call through the stack, waiting for its successful result."""
    result = agent.result_of(agent.call(capability, params), timeout=120)
    assert result["payload"]["success"] is True, result


def consumer_frame(agent: Agent) -> None:
    """A frame the consumer answers without the DB (initialize again: ALREADY_INITIALIZED)."""
    agent.reply_to(agent.send("initialize", {}), "initialize-result")


def document(pages: int) -> str:
    """An HTML document of `pages` pages of ordinary text."""
    paragraph = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 12 + "</p>"
    return "".join(
        f"<section style='page-break-after: always'><h1>Section {n}</h1>{paragraph * 4}</section>"
        for n in range(pages)
    )


def render_locally(html: str) -> bytes:
    """The same WeasyPrint call the PDF runner makes, without the stack around it."""
    pdf: bytes = weasyprint.HTML(string=html).write_pdf()
    return pdf


def photo(width: int = 4000, height: int = 3000) -> bytes:
    """A 12 MP JPEG with photo-like detail (a gradient under noise)."""
    noise = Image.effect_noise((width, height), 40).convert("RGB")
    gradient = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    buffer = io.BytesIO()
    Image.blend(noise, gradient, 0.5).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def naive_resize(data: bytes) -> bytes:
    """The obvious Pillow code: open, resize, save."""
    resized = Image.open(io.BytesIO(data)).resize((800, 600), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    resized.save(out, "JPEG")
    return out.getvalue()


def best_resize(data: bytes) -> bytes:
    """The best in-process recipe (JPEG draft + reducing_gap, the image runner's own)."""
    image = images.fast_downscale(data, (800, 600))
    out = io.BytesIO()
    image.save(out, "JPEG")
    return out.getvalue()


def bare_worker(log_dir: Path) -> ManagedProcess:
    """A prefork worker (2 processes) of the bare Celery app in bench/bare_celery.py."""
    return ManagedProcess(
        "bare-worker",
        python_tool(
            "celery", "-A", "bench.bare_celery", "worker", "-P", "prefork", "-c", "2",
            "-Q", "bare", "-n", "bare@%h", "-l", "info", "--without-gossip", "--without-mingle",
        ),
        log_dir,
    )  # fmt: skip


def bare_celery_calls(n: int) -> list[float]:
    """n bare Celery `apply_async().get()` round trips, in ms."""
    from bench.bare_celery import echo

    times = []
    for _ in range(n):
        start = time.perf_counter()
        echo.apply_async(args=(1,)).get(timeout=10)
        times.append((time.perf_counter() - start) * 1000)
    return times


class ProcessCpu:
    """CPU seconds (user + sys) of named processes, with their children unless `alone`."""

    def __init__(self, roots: dict[str, int], alone: tuple[str, ...] = ()) -> None:
        self.roots = {name: psutil.Process(pid) for name, pid in roots.items()}
        self.alone = alone

    def read(self) -> dict[str, float]:
        """Each one's CPU seconds so far (a child that exited counts in its parent)."""
        seconds: dict[str, float] = {}
        for name, root in self.roots.items():
            total = 0.0
            children = () if name in self.alone else root.children(recursive=True)
            for process in (root, *children):
                try:
                    t = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += t.user + t.system + t.children_user + t.children_system
            seconds[name] = total
        return seconds
