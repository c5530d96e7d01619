"""What authentication and the limits cost, through the whole stack.

Prints, in one run against Daphne, Redis and a prefork Celery worker:
- opening a WebSocket and initializing a session, with an agent key (the key's row
  read and its hash compared) and with a page token (a signature checked), against
  the same with the connection refused (no credentials: no DB read at all);
- one hit of the calls-per-minute limiter (a moving window in Redis), alone;
- a small call's round trip (it includes that hit).

Run: .venv/bin/python bench/auth_overhead.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

from websockets.exceptions import ConnectionClosed  # noqa: E402

from bench import stats  # noqa: E402
from capabilities.access import (  # noqa: E402
    page_tokens,
    rate_limits,
)
from tests.support.agent import Agent  # noqa: E402


def open_sessions(rounds: int, **how: object) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with Agent(STACK.ws_url, **how) as agent:  # type: ignore[arg-type]
            agent.initialize()
            times.append((time.perf_counter() - start) * 1000)
    return times


def refused_connections(rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with Agent(STACK.ws_url, key=None) as agent:
            try:
                while True:
                    agent.receive(timeout=5)
            except ConnectionClosed:
                times.append((time.perf_counter() - start) * 1000)
    return times


async def limiter_hits(rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await rate_limits.retry_after_ms("bench:limiter", 1_000_000)
        times.append((time.perf_counter() - start) * 1000)
    return times


def small_calls(rounds: int) -> list[float]:
    times = []
    with Agent(STACK.ws_url) as agent:
        agent.initialize()
        for _ in range(rounds):
            start = time.perf_counter()
            agent.result_of(agent.call("test.sleep", {"steps": 0}))
            times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    try:
        STACK.start()
        origin = STACK.http_url.rstrip("/")
        page = {
            "key": None,
            "subprotocols": ["abp", f"abp.bearer.{page_tokens.issue(origin)}"],
            "additional_headers": {"Origin": origin},
        }
        open_sessions(20)  # warm up
        small_calls(20)
        keyed, paged, refused = [], [], []
        for _ in range(args.rounds // 20):  # interleaved, so load drifts hit all alike
            keyed += open_sessions(20)
            paged += open_sessions(20, **page)
            refused += refused_connections(20)
        hits = asyncio.run(limiter_hits(args.rounds))
        calls = small_calls(args.rounds)
    finally:
        STACK.stop()
        STACK.remove_files()

    baseline = stats.summary(refused)["p50"]
    print("\n== Opening a session (connect + initialize-result)")
    print(stats.line("refused, no credentials (connect + close)", refused))
    print(stats.line("agent key (Authorization: Bearer)", keyed, baseline))
    print(stats.line("page token (subprotocol, Origin checked)", paged, baseline))
    print("\n== Calls")
    print(stats.line("calls-per-minute limiter, one hit (Redis)", hits))
    print(stats.line("small call round trip (includes one hit)", calls))
    share = stats.summary(hits)["p50"] / stats.summary(calls)["p50"]
    print(f"\nthe limiter is {share:.0%} of a small call's p50")


if __name__ == "__main__":
    main()
