"""A small call over the JSON-RPC door against the same call over /abp/ws, and its cancels.

Through the whole stack, in one event loop: an ABP client on /abp/ws and a JSON-RPC
2.0 client on /abp/rpc take turns, call by call, so both see the same machine. Then,
over /abp/rpc, cancels of a running test.sleep, `$/cancel_request` and `_abp/cancel`
in turn: cancel -> the call's -32800, cancel -> `{cancelled: true}` and cancel ->
the job's `stopped_at`.

Run: .venv/bin/python bench/jsonrpc_call.py [--calls 200] [--cancels 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from bench import stats  # noqa: E402
from capabilities.models import Job  # noqa: E402

Message = dict[str, Any]
MARKDOWN = {"markdown": "# Title\n\nSome *text*."}
# 60 s of checkpoints every 20 ms: always cancelled, stoppable at the next step.
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}
# Each cancel waits this long after the job's first progress, as mcp_call.py does, so
# that it lands in the work's checkpoint loop rather than in its start.
SETTLE_SECONDS = 0.05


class AbpCaller:
    """Just enough ABP over a WebSocket to time a call.

    mcp_call.py's, copied: importing that module would prepare a second environment.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.number = 0

    async def send(self, kind: str, payload: dict[str, Any]) -> str:
        self.number += 1
        message_id = f"m{self.number}"
        await self.ws.send(json.dumps({"type": kind, "id": message_id, "payload": payload}))
        return message_id

    async def reply(self, message_id: str) -> Message:
        while True:
            envelope: Message = json.loads(await self.ws.recv())
            if envelope.get("id") == message_id:
                return envelope

    async def call(self, capability: str, params: dict[str, Any]) -> Message:
        message_id = await self.send(
            "capabilities/call", {"capability": capability, "params": params}
        )
        return await self.reply(message_id)


class RpcCaller:
    """Just enough JSON-RPC 2.0 over a WebSocket to time calls and cancels."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.number = 0
        self.session_id: uuid.UUID | None = None

    async def request(self, method: str, params: dict[str, Any]) -> int:
        """Send a request; its id."""
        self.number += 1
        await self.ws.send(
            json.dumps({"jsonrpc": "2.0", "id": self.number, "method": method, "params": params})
        )
        return self.number

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification (never answered)."""
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}))

    async def until(self, wanted: Callable[[Message], bool]) -> Message:
        """The next message `wanted` accepts; anything before it is dropped."""
        while True:
            message: Message = json.loads(await self.ws.recv())
            if wanted(message):
                return message

    async def responses(self, *ids: int) -> dict[int, tuple[Message, float]]:
        """The responses to these ids, each with its perf_counter arrival, in any order."""
        arrived: dict[int, tuple[Message, float]] = {}
        while len(arrived) < len(ids):
            message = await self.until(lambda m: "method" not in m and m.get("id") in ids)
            arrived[message["id"]] = (message, time.perf_counter())
        return arrived

    async def initialize(self) -> None:
        request_id = await self.request(
            "initialize", {"protocolVersion": 1, "clientInfo": {"name": "bench", "version": "1"}}
        )
        (response, _) = (await self.responses(request_id))[request_id]
        self.session_id = uuid.UUID(response["result"]["_meta"]["abp/sessionId"])

    async def call(self, capability: str, params: dict[str, Any]) -> Message:
        request_id = await self.request("_abp/call", {"capability": capability, "params": params})
        return (await self.responses(request_id))[request_id][0]


@dataclass
class CancelRuns:
    """What the cancels measured, in ms from the cancel being sent."""

    request_to_error: list[float] = field(default_factory=list)
    request_to_stop: list[float] = field(default_factory=list)
    cancel_to_confirm: list[float] = field(default_factory=list)
    cancel_to_error: list[float] = field(default_factory=list)
    cancel_to_stop: list[float] = field(default_factory=list)


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}"}


def _rpc_url() -> str:
    return STACK.ws_url.removesuffix("/abp/ws") + "/abp/rpc"


async def compare(calls: int) -> tuple[list[float], list[float]]:
    """Markdown round trips: over /abp/ws and over /abp/rpc, alternating."""
    abp: list[float] = []
    rpc: list[float] = []
    async with (
        connect(STACK.ws_url, additional_headers=_headers()) as ws,
        connect(_rpc_url(), additional_headers=_headers()) as rpc_ws,
    ):
        agent = AbpCaller(ws)
        await agent.reply(
            await agent.send("initialize", {"agent": {"name": "bench", "version": "1"}})
        )
        client = RpcCaller(rpc_ws)
        await client.initialize()
        for _ in range(10):  # warm up both
            await agent.call("convert.markdownToHtml", MARKDOWN)
            await client.call("convert.markdownToHtml", MARKDOWN)
        for _ in range(calls):
            start = time.perf_counter()
            answer = await agent.call("convert.markdownToHtml", MARKDOWN)
            abp.append((time.perf_counter() - start) * 1000)
            assert answer["payload"]["success"] is True, answer
            start = time.perf_counter()
            response = await client.call("convert.markdownToHtml", MARKDOWN)
            rpc.append((time.perf_counter() - start) * 1000)
            assert "html" in response["result"]["data"], response
    return abp, rpc


async def cancels(rounds: int) -> CancelRuns:
    """Per round, a running test.sleep cancelled by `$/cancel_request`, one by `_abp/cancel`."""
    runs = CancelRuns()
    async with connect(_rpc_url(), additional_headers=_headers()) as ws:
        client = RpcCaller(ws)
        await client.initialize()
        assert client.session_id is not None
        for i in range(rounds):
            for by_request in (True, False):
                call_id = f"bench-{'request' if by_request else 'cancel'}-{i}"
                call = await client.request(
                    "_abp/call",
                    {
                        "capability": "test.sleep",
                        "params": LONG,
                        "callId": call_id,
                        "_meta": {"progressToken": call_id},
                    },
                )
                # The first progress from the work itself (not the queue's): it started.
                await asyncio.wait_for(client.until(_started(call_id)), 20)
                await asyncio.sleep(SETTLE_SECONDS)
                wall = time.time()
                start = time.perf_counter()
                if by_request:
                    await client.notify("$/cancel_request", {"requestId": call})
                    answered = await client.responses(call)
                else:
                    cancel = await client.request("_abp/cancel", {"callId": call_id})
                    answered = await client.responses(call, cancel)
                    confirm, confirmed_at = answered[cancel]
                    assert confirm["result"]["cancelled"] is True, confirm
                    runs.cancel_to_confirm.append((confirmed_at - start) * 1000)
                error, errored_at = answered[call]
                assert error["error"]["code"] == -32800, error
                stopped = await asyncio.to_thread(_stopped_after, client.session_id, call_id, wall)
                if by_request:
                    runs.request_to_error.append((errored_at - start) * 1000)
                    runs.request_to_stop.append(stopped)
                else:
                    runs.cancel_to_error.append((errored_at - start) * 1000)
                    runs.cancel_to_stop.append(stopped)
    return runs


def _started(token: str) -> Callable[[Message], bool]:
    """Accepts the call's first progress from its work (the queue's says `queued`)."""

    def started(message: Message) -> bool:
        return (
            message.get("method") == "_abp/progress"
            and message["params"]["progressToken"] == token
            and message["params"]["status"] == "running"
        )

    return started


def _stopped_after(session_id: uuid.UUID, call_id: str, cancelled_at: float) -> float:
    """Ms from the cancel to the job's stopped_at, once the worker has written it."""
    deadline = time.time() + 10
    jobs = Job.objects.filter(session_id=session_id, call_id=call_id, stopped_at__isnull=False)
    while time.time() < deadline:
        job = jobs.first()
        if job is not None and job.stopped_at is not None:
            return (job.stopped_at.timestamp() - cancelled_at) * 1000
        time.sleep(0.005)
    raise TimeoutError(f"the cancelled job {call_id} did not stop")


async def run(calls: int, rounds: int) -> tuple[list[float], list[float], CancelRuns]:
    abp, rpc = await compare(calls)
    return abp, rpc, await cancels(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()
    try:
        STACK.start()
        abp, rpc, runs = asyncio.run(run(args.calls, args.cancels))
    finally:
        STACK.stop()
        STACK.remove_files()
    baseline, over_rpc = stats.summary(abp), stats.summary(rpc)
    print("\n== convert.markdownToHtml round trip, alternating on one event loop")
    print(stats.line("over /abp/ws (baseline)", abp))
    print(stats.line("over /abp/rpc (JSON-RPC _abp/call)", rpc, baseline["p50"]))
    print(
        f"   RPC/ABP: p50 {over_rpc['p50'] / baseline['p50']:.2f}x,"
        f" p99 {over_rpc['p99'] / baseline['p99']:.2f}x"
    )
    print("\n== cancel of a running test.sleep (checkpoints every 20 ms) over /abp/rpc")
    print(stats.line("$/cancel_request -> the call's -32800", runs.request_to_error))
    print(stats.line("$/cancel_request -> work stopped (stopped_at)", runs.request_to_stop))
    print(stats.line("_abp/cancel -> {cancelled: true}", runs.cancel_to_confirm))
    print(stats.line("_abp/cancel -> the call's -32800", runs.cancel_to_error))
    print(stats.line("_abp/cancel -> work stopped (stopped_at)", runs.cancel_to_stop))


if __name__ == "__main__":
    main()
