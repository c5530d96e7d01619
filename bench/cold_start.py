"""The first small call after start, against the warm median, under load.

Each round starts a fresh Daphne (and its local lane), waits until `/readyz` says
ready, and then at once: two `export.pdf` calls render on the heavy worker (the
load), and one session makes a first `convert.markdownToHtml` call, then
`--warm` more. Prints the first call's time, the warm median, their ratio (goal:
within 2x), and how long Daphne took to be ready.

Run: .venv/bin/python bench/cold_start.py [--rounds 3] [--warm 20] [--no-load]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-cold-", DJANGO_LOG_LEVEL="WARNING")

from bench.common import document  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

MARKDOWN = "# Notes\n\nA *short* document with a [link](https://example.com).\n\n- one\n- two\n"


def ready_status() -> int:
    """/readyz's status code (0: Daphne not listening yet)."""
    connection = http.client.HTTPConnection("127.0.0.1", STACK.web_port, timeout=5)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def small_call(agent: Agent) -> float:
    """One markdown call, call to result, in ms."""
    start = time.perf_counter()
    result = agent.result_of(agent.call("convert.markdownToHtml", {"markdown": MARKDOWN}))
    assert result["payload"]["success"] is True, result
    return (time.perf_counter() - start) * 1000


def one_round(warm: int, load: bool) -> tuple[float, float, float]:
    """(seconds until ready, first call ms, warm median ms) of a fresh Daphne."""
    STACK.web.stop()
    started = time.perf_counter()
    STACK.start_web()
    while ready_status() != 200:
        time.sleep(0.01)
    ready_after = time.perf_counter() - started
    loader = Agent(STACK.ws_url) if load else None
    try:
        if loader is not None:
            loader.initialize()
            html = document(30)
            for _ in range(2):
                loader.call("export.pdf", {"html": html})
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            first = small_call(agent)
            rest = [small_call(agent) for _ in range(warm)]
    finally:
        if loader is not None:
            loader.close()
    return ready_after, first, statistics.median(rest)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=20, help="calls after the first")
    parser.add_argument("--no-load", action="store_true", help="no PDFs rendering meanwhile")
    args = parser.parse_args()
    rows = []
    try:
        STACK.start()
        for _ in range(args.rounds):
            rows.append(one_round(args.warm, not args.no_load))
    finally:
        STACK.stop()
        STACK.remove_files()
    load = "idle" if args.no_load else "two export.pdf rendering"
    print(f"\n## First call after start ({load}; {args.rounds} fresh Daphnes)\n")
    print("| round | ready after, s | first call, ms | warm median, ms | first / warm (goal 2x) |")
    print("|---|---|---|---|---|")
    for n, (ready, first, warm) in enumerate(rows, start=1):
        print(f"| {n} | {ready:.2f} | {first:.1f} | {warm:.1f} | {first / warm:.2f}x |")


if __name__ == "__main__":
    main()
