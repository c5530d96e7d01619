"""A small call's round trip while every heavy worker process renders a long PDF.

Prints, through the whole stack (Daphne, Redis, a heavy worker with two processes and
a small worker with one): convert.markdownToHtml with the heavy worker idle, then
with both of its processes busy on 200-page export.pdf calls, alternating so that
both sides see the same machine.

Run: .venv/bin/python bench/small_behind_heavy.py [--calls 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

from bench import stats  # noqa: E402
from capabilities.models import Job, JobStatus  # noqa: E402
from tests.support.agent import Agent  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

PDF_HTML = "".join(
    f"<section style='page-break-after: always'><h1>Page {n}</h1>{'<p>text</p>' * 20}</section>"
    for n in range(200)
)
MARKDOWN = {"markdown": "# Title\n\nSome *text* and a [link](https://example.com)."}


def small_call(agent: Agent) -> float:
    start = time.perf_counter()
    result = agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN))
    assert result["payload"]["success"] is True
    return (time.perf_counter() - start) * 1000


def busy_heavy_worker(agent: Agent, round_number: int) -> list[str]:
    """Two long renders, running: both processes of the heavy worker are busy."""
    call_ids = [f"pdf-{round_number}-{n}" for n in range(2)]
    for call_id in call_ids:
        agent.call("export.pdf", {"html": PDF_HTML}, call_id=call_id)
    running = Job.objects.filter(
        session_id=agent.session_id, call_id__in=call_ids, status=JobStatus.RUNNING
    )
    eventually(lambda: running.count() == 2, timeout=30)
    return call_ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    idle: list[float] = []
    busy: list[float] = []
    try:
        STACK.start()
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            for _ in range(10):
                small_call(agent)  # warm up
            rounds = 10
            for number in range(rounds):
                idle += [small_call(agent) for _ in range(args.calls // rounds)]
                heavy = busy_heavy_worker(agent, number)
                busy += [small_call(agent) for _ in range(args.calls // rounds)]
                for call_id in heavy:
                    agent.cancel(call_id)
                agent.inbox.clear()
    finally:
        STACK.stop()
        STACK.remove_files()
    print("\n== convert.markdownToHtml round trip (small queue, its own worker)")
    print(stats.line("heavy worker idle (baseline)", idle))
    print(stats.line("both heavy processes rendering 200 pages", busy, stats.summary(idle)["p50"]))


if __name__ == "__main__":
    main()
