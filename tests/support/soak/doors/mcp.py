"""The MCP door (/mcp), with the official Python SDK on both wires: the 2025-11-25
session wire (`mode="legacy"`) and the 2026-07-28 session-less one.

A cancel is the SDK's own (the awaiting task cancelled: `notifications/cancelled` or the
request's stream closed); a client-side timeout is `read_timeout_seconds`. An MCP session
lives in the Daphne that opened it: when that Daphne dies, its calls fail and the client
is told so (the SDK raises); the lane then opens a new client.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.mcp_clients import official_client
from tests.support.soak import plan
from tests.support.soak.doors.lane import Lane
from tests.support.soak.doors.pending import settle
from tests.support.soak.ledger import Ledger, Op, names_call

WIRES = {"mcp2025": "legacy", "mcp2026": "2026-07-28"}


def outcome_of(result: Any, tag: str) -> tuple[str, dict[str, Any], bool]:
    """A CallToolResult as (outcome, detail, names this call)."""
    text = " ".join(getattr(part, "text", "") for part in result.content or [])
    return outcome_of_parts(result.is_error, text, result.structured_content, tag)


def outcome_of_parts(
    is_error: bool, text: str, structured: Any, tag: str
) -> tuple[str, dict[str, Any], bool]:
    """A tool result's parts (`isError`, its text, `structuredContent`) as an outcome."""
    if is_error and "could not be queued; try again" in text:
        # The retryable refusal of a call whose row could not be written (PostgreSQL away).
        error = {"code": "INTERNAL_ERROR", "retryable": True}
        return "error:INTERNAL_ERROR", {"text": text[:200], "error": error}, True
    if is_error:
        for code in ("TIMEOUT", "CANCELLED", "WORKER_LOST", "CAPABILITY_UNAVAILABLE"):
            if code in text:
                outcome = {"TIMEOUT": "timeout", "CANCELLED": "cancelled"}.get(
                    code, f"error:{code}"
                )
                return outcome, {"text": text[:200]}, True
        return "error:OTHER", {"text": text[:200]}, True
    return "succeeded", {}, names_call(tag, structured)


async def one_call(client: Any, op: Op, planned: plan.Planned, ledger: Ledger) -> None:
    """Make one call; its answer, its cancel, or what the client was told."""
    arguments = plan.params_for(op.tag, planned)
    call = client.call_tool(planned.capability, arguments)
    try:
        if planned.cancel_after is None:
            result = await call
        else:
            result = await asyncio.wait_for(call, planned.cancel_after)
    except TimeoutError:
        op.cancelled_at = ledger.now()
        ledger.count(op.door, "cancels")
        ledger.note(op, f"cancelled by the SDK ({op.cancel_plan})")
        # MCP answers a cancelled request with nothing: the cancel is the end of it.
        ledger.answer(op, "cancelled", {"client": "cancelled its request"})
        return
    outcome, detail, ok = outcome_of(result, op.tag)
    ledger.answer(op, outcome, detail, data_ok=ok)


async def lane(door: str, url: str, key: str, ctx: Lane, *, pace: float) -> None:
    """Clients making calls until the stop: a new one as soon as one fails (whose calls
    still out are waited for beside it)."""
    sessions: set[asyncio.Task[None]] = set()
    while not ctx.stop.is_set():
        broken = asyncio.Event()
        sessions.add(asyncio.create_task(_session(door, (url, key), ctx, broken, pace=pace)))
        ended = [asyncio.create_task(broken.wait()), asyncio.create_task(ctx.stop.wait())]
        await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
        for waiter in ended:
            waiter.cancel()
        if not ctx.stop.is_set():
            await asyncio.sleep(1.0)
    await asyncio.gather(*sessions)


async def _session(
    door: str, where: tuple[str, str], ctx: Lane, broken: asyncio.Event, *, pace: float
) -> None:
    """One client (at `where`: URL, key): calls until the stop or its first failure, then
    its calls' answers."""
    ledger, (url, key) = ctx.ledger, where
    calls: dict[asyncio.Task[None], Op] = {}
    try:
        async with official_client(url, key=key, mode=WIRES[door]) as client:
            ledger.count(door, "sessions")
            while not ctx.stop.is_set() and not broken.is_set():
                planned = plan.next_call(ctx.rng, ctx.mix)
                op = ledger.new(door, planned.capability, planned.cancel_plan, None)
                calls[asyncio.create_task(_guarded(client, op, planned, ledger, broken))] = op
                await ctx.pause(pace)
            await settle(calls, ledger)
    except Exception as failed:  # any failure of the session ends it, and is counted
        ledger.count(door, f"sessions failed: {type(failed).__name__}")
    broken.set()


async def _guarded(
    client: Any, op: Op, planned: plan.Planned, ledger: Ledger, broken: asyncio.Event
) -> None:
    try:
        await one_call(client, op, planned, ledger)
    except Exception as failed:  # the client was told: that is its answer
        op.told = f"{type(failed).__name__}: {str(failed)[:200]}"
        ledger.note(op, f"told: {op.told}")
        broken.set()
