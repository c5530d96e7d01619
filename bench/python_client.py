"""The Python client (abp_jobs_client) against a bare websockets loop, on the same stack.

One event loop: a small call through `AsyncClient.call()` and the same call as two
hand-written frames on a raw socket take turns, call by call, so both see the same
machine. Then `handle.cancel()` of a running test.sleep: send -> the server's
confirmation (`handle.confirmed_in_ms`), and send -> the call raising CallCancelled.

Run: .venv/bin/python bench/python_client.py [--calls 200] [--cancels 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-client-")

from abp_jobs_client import AsyncClient, CallCancelled, Progress  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from bench import stats  # noqa: E402

MARKDOWN = {"markdown": "# Title\n\nSome *text*."}
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}


def _key() -> str:
    return os.environ["ABP_TEST_AGENT_KEY"]


async def compare(calls: int) -> tuple[list[float], list[float]]:
    """Markdown round trips: through the client, and as raw frames, alternating."""
    ours: list[float] = []
    bare: list[float] = []
    headers = {"Authorization": f"Bearer {_key()}"}
    async with (
        AsyncClient(STACK.ws_url, key=_key()) as client,
        connect(STACK.ws_url, additional_headers=headers) as ws,
    ):
        hello = {"agent": {"name": "bench", "version": "1"}}
        await ws.send(json.dumps({"type": "initialize", "id": "0", "payload": hello}))
        await ws.recv()

        async def raw_call(number: int) -> None:
            payload = {"capability": "convert.markdownToHtml", "params": MARKDOWN}
            frame = {"type": "capabilities/call", "id": str(number), "payload": payload}
            await ws.send(json.dumps(frame))
            while json.loads(await ws.recv()).get("id") != str(number):
                pass

        for number in range(1, calls + 11):
            start = time.perf_counter()
            result = await client.call("convert.markdownToHtml", MARKDOWN)
            took = (time.perf_counter() - start) * 1000
            assert "<h1" in result.data["html"]
            start = time.perf_counter()
            await raw_call(number)
            if number > 10:  # the first ten warm both up
                ours.append(took)
                bare.append((time.perf_counter() - start) * 1000)
    return ours, bare


async def cancels(rounds: int) -> tuple[list[float], list[float]]:
    """handle.cancel() of running jobs: to the confirmation, and to CallCancelled."""
    confirmed: list[float] = []
    raised: list[float] = []
    async with AsyncClient(STACK.ws_url, key=_key()) as client:
        for _ in range(rounds):
            started = asyncio.Event()

            def progressed(_: Progress, started: asyncio.Event = started) -> None:
                started.set()

            handle = await client.start("test.sleep", LONG, on_progress=progressed)
            await asyncio.wait_for(started.wait(), 20)
            await asyncio.sleep(0.05)
            start = time.perf_counter()
            await handle.cancel()
            confirmed.append(handle.confirmed_in_ms or 0.0)
            try:
                await handle
            except CallCancelled:
                raised.append((time.perf_counter() - start) * 1000)
    return confirmed, raised


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()
    STACK.start()
    try:
        ours, bare = asyncio.run(compare(args.calls))
        confirmed, raised = asyncio.run(cancels(args.cancels))
    finally:
        STACK.stop()
        STACK.remove_files()
    print(f"\n== small call, {args.calls} rounds alternating")
    print(stats.line("raw websockets frames (baseline)", bare))
    print(stats.line("abp_jobs_client AsyncClient.call()", ours, stats.percentile(bare, 50)))
    print(f"   client / raw at p50: {stats.ratio(ours, bare):.2f}x")
    print(f"\n== handle.cancel() of a running call, {args.cancels} rounds")
    print(stats.line("cancel -> confirmation", confirmed))
    print(stats.line("cancel -> CallCancelled raised", raised))


if __name__ == "__main__":
    main()
