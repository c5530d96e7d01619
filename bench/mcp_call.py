"""A small tool call over MCP against the same call over /abp/ws, and an MCP cancel.

Through the whole stack, in one event loop: the official MCP Python client (a
stateful 2025 session, SSE responses) and an ABP WebSocket client take turns,
call by call, so both see the same machine. Then MCP cancels (the client
abandoning a running call, which sends notifications/cancelled) timed from the
cancel to the job's `stopped_at`.

Run: .venv/bin/python bench/mcp_call.py [--calls 200] [--cancels 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from bench import stats  # noqa: E402
from capabilities.models import Job  # noqa: E402
from tests.support.mcp_clients import RawSession, events_of, official_client  # noqa: E402

MARKDOWN = {"markdown": "# Title\n\nSome *text*."}
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}


class AbpCaller:
    """Just enough ABP over a WebSocket to time a call."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.number = 0

    async def send(self, kind: str, payload: dict[str, Any]) -> str:
        self.number += 1
        message_id = f"m{self.number}"
        await self.ws.send(json.dumps({"type": kind, "id": message_id, "payload": payload}))
        return message_id

    async def reply(self, message_id: str) -> dict[str, Any]:
        while True:
            envelope: dict[str, Any] = json.loads(await self.ws.recv())
            if envelope.get("id") == message_id:
                return envelope

    async def call(self, capability: str, params: dict[str, Any]) -> dict[str, Any]:
        message_id = await self.send(
            "capabilities/call", {"capability": capability, "params": params}
        )
        return await self.reply(message_id)


async def compare(calls: int) -> tuple[list[float], list[float], list[float], float, float]:
    """Markdown round trips over /abp/ws, /mcp and /mcp raw, in turn; client CPU per call.

    The client's own CPU is the floor a door's round trip cannot go below: the MCP
    SDK's client (httpx, SSE, pydantic) spends more per call than the whole WebSocket
    round trip takes. The raw MCP client (a 2025 session over plain HTTP, the SSE
    read by hand) is as lean as the WebSocket side's: the server's part of the gap.
    """
    abp: list[float] = []
    mcp: list[float] = []
    raw: list[float] = []
    abp_cpu = mcp_cpu = 0.0
    headers = {"Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}"}
    async with (
        connect(STACK.ws_url, additional_headers=headers) as ws,
        official_client(f"{STACK.http_url}/mcp", mode="legacy") as client,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        plain = RawSession(http, f"{STACK.http_url}/mcp", os.environ["ABP_TEST_AGENT_KEY"])
        await plain.open()
        agent = AbpCaller(ws)
        await agent.reply(
            await agent.send("initialize", {"agent": {"name": "bench", "version": "1"}})
        )
        for _ in range(10):  # warm up both
            await agent.call("convert.markdownToHtml", MARKDOWN)
            await client.call_tool("convert.markdownToHtml", MARKDOWN)
            await _raw_call(plain, 0)
        for number in range(calls):
            start, cpu = time.perf_counter(), time.process_time()
            answer = await agent.call("convert.markdownToHtml", MARKDOWN)
            abp.append((time.perf_counter() - start) * 1000)
            abp_cpu += time.process_time() - cpu
            assert answer["payload"]["success"] is True
            start, cpu = time.perf_counter(), time.process_time()
            result = await client.call_tool("convert.markdownToHtml", MARKDOWN)
            mcp.append((time.perf_counter() - start) * 1000)
            mcp_cpu += time.process_time() - cpu
            assert result.is_error is False
            start = time.perf_counter()
            await _raw_call(plain, number + 1)
            raw.append((time.perf_counter() - start) * 1000)
    return abp, mcp, raw, abp_cpu * 1000 / calls, mcp_cpu * 1000 / calls


async def _raw_call(session: RawSession, request_id: int) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "convert.markdownToHtml", "arguments": MARKDOWN},
    }
    async with session.http.stream(
        "POST", session.url, headers=session.headers(), json=body
    ) as response:
        if response.headers.get("content-type", "").startswith("application/json"):
            answers = [json.loads(await response.aread())]
        else:
            answers = [m async for m in events_of(response) if m.get("id") == request_id]
    assert answers, "no answer"
    assert answers[0]["result"]["isError"] is False


async def cancels(rounds: int) -> list[float]:
    """Cancel -> work stopped (Job.stopped_at), the client abandoning a running call."""
    stops: list[float] = []
    async with official_client(f"{STACK.http_url}/mcp", mode="legacy") as client:
        for _ in range(rounds):
            started = anyio.Event()

            async def on_progress(
                progress: float,
                total: float | None,
                message: str | None,
                started: anyio.Event = started,
            ) -> None:
                started.set()

            since = time.time()
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    await client.call_tool("test.sleep", LONG, progress_callback=on_progress)

                group.start_soon(call)
                await started.wait()
                await anyio.sleep(0.05)
                cancelled_at = time.time()
                group.cancel_scope.cancel()
            stops.append(await anyio.to_thread.run_sync(_stopped_after, since, cancelled_at))
    return stops


def _stopped_after(since: float, cancelled_at: float) -> float:
    deadline = time.time() + 10
    while time.time() < deadline:
        job = (
            Job.objects.filter(capability="test.sleep", stopped_at__isnull=False)
            .filter(created_at__gte=_aware(since))
            .first()
        )
        if job is not None and job.stopped_at is not None:
            return (job.stopped_at.timestamp() - cancelled_at) * 1000
        time.sleep(0.005)
    raise TimeoutError("the cancelled job did not stop")


def _aware(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()
    try:
        STACK.start()
        abp, mcp, raw, abp_cpu, mcp_cpu = anyio.run(compare, args.calls)
        stops = anyio.run(cancels, args.cancels)
    finally:
        STACK.stop()
        STACK.remove_files()
    print("\n== convert.markdownToHtml round trip, alternating on one event loop")
    print(stats.line("over /abp/ws (baseline)", abp))
    print(stats.line("over /mcp (official client, 2025 session)", mcp, stats.summary(abp)["p50"]))
    print(stats.line("over /mcp (raw HTTP, 2025 session)", raw, stats.summary(abp)["p50"]))
    print(f"client CPU per call, user + sys: /abp/ws {abp_cpu:.2f} ms, /mcp {mcp_cpu:.2f} ms")
    print("\n== MCP cancel (client abandons the call) -> work stopped (Job.stopped_at)")
    print(stats.line("test.sleep, checkpoints every 20 ms", stops))


if __name__ == "__main__":
    main()
