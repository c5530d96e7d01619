"""Many small calls in flight over WebSocket sessions, for the load benchmarks.

`prepare_stack` first (before anything imports Django); sessions use its agent key.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from websockets.asyncio.client import ClientConnection, connect

from tests.support import environment
from tests.support.agent import envelope
from tests.support.stack import Stack


def prepare_stack(prefix: str) -> Stack:
    """The bench's stack: `--env KEY=VALUE` from the command line, a key above its pace.

    Every call is accepted and may run at once: no budget of the key refuses or
    queues one.
    """
    overrides = dict(
        sys.argv[i + 1].split("=", 1) for i, arg in enumerate(sys.argv[:-1]) if arg == "--env"
    )
    return environment.prepare(
        prefix,
        **overrides,
        ABP_MAX_QUEUED_CALLS="100000",
        ABP_MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL="100000",
        ABP_MAX_CONCURRENT_CALLS="100000",
        DJANGO_LOG_LEVEL="WARNING",
    )


MARKDOWN = "# Notes\n\nA *short* document with a [link](https://example.com).\n\n- one\n- two\n"
INITIALIZE = {
    "agent": {"name": "throughput-bench", "version": "1.0"},
    "protocolVersion": "0.1",
    "features": {"notifications": False, "progress": False},
}


async def open_session(url: str) -> ClientConnection:
    """A WebSocket session with the suite's key, initialized."""
    headers = {"Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}"}
    ws = await connect(url, max_size=None, additional_headers=headers, proxy=None)
    await ws.send(envelope("initialize", "init", INITIALIZE))
    reply = json.loads(await ws.recv())
    if reply["type"] != "initialize-result" or "error" in reply:
        raise RuntimeError(f"initialize failed: {reply}")
    return ws


async def burst(ws: ClientConnection, calls: int, tag: str) -> tuple[float, float]:
    """Send `calls` calls at once, wait for every result: (sent, answered) in seconds."""
    frames = [
        envelope(
            "capabilities/call",
            f"{tag}-{n}",
            {
                "capability": "convert.markdownToHtml",
                "params": {"markdown": MARKDOWN},
                "options": {"callId": f"{tag}-{n}"},
            },
        )
        for n in range(calls)
    ]
    start = time.perf_counter()
    for frame in frames:
        await ws.send(frame)
    sent = time.perf_counter() - start
    waiting = calls
    while waiting:
        message = json.loads(await ws.recv())
        if message["type"] != "capabilities/call-result":
            continue
        if message["payload"].get("success") is not True:
            raise RuntimeError(f"a call failed: {message}")
        waiting -= 1
    return sent, time.perf_counter() - start


async def ours(sessions: list[ClientConnection], calls: int, tag: str) -> float:
    """Seconds to answer `calls` calls on each session, all sent at once."""
    start = time.perf_counter()
    await asyncio.gather(*(burst(ws, calls, f"{tag}-{i}") for i, ws in enumerate(sessions)))
    return time.perf_counter() - start
