"""MCP tasks (SEP-2663) on the 2026-07-28 wire, over raw HTTP as in the tasks tests.

A `tools/call` that declares the tasks extension is a task: polled with `tasks/get`
until it ends, cancelled with `tasks/cancel` at its moment. A task is answered once,
by the `tasks/get` that finds it ended; a poll or cancel refused on the way (its Daphne
died, PostgreSQL restarting) is asked again, as the task lives on in the server. A
`tools/call` refused is what the client was told.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2

from tests.support.mcp_clients import RawModern
from tests.support.soak import plan
from tests.support.soak.doors.lane import Lane
from tests.support.soak.doors.mcp import outcome_of_parts
from tests.support.soak.doors.pending import settle
from tests.support.soak.ledger import Ledger, Op

DOOR = "mcptasks"
POLL_SECONDS = 0.3
ENDED = {"completed", "failed", "cancelled"}
# A task nobody could read for this long is given up (a violation if its job ended).
POLL_FOR_SECONDS = 120.0


class Told(Exception):
    """The server answered with an error, not the task."""


async def rpc(client: RawModern, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A request's `result`; Told with the error or the HTTP failure."""
    try:
        answer = await client.rpc(method, params)
    except (httpx2.HTTPError, AssertionError, ValueError) as failed:
        raise Told(f"{method}: {type(failed).__name__}: {str(failed)[:150]}") from failed
    if "error" in answer:
        raise Told(f"{method}: {answer['error']}"[:300])
    result: dict[str, Any] = answer["result"]
    return result


def outcome_of(task: dict[str, Any], tag: str) -> tuple[str, dict[str, Any], bool]:
    """An ended task as (outcome, detail, names this call)."""
    if task["status"] == "cancelled":
        return "cancelled", {"status": "cancelled"}, True
    result = task.get("result") or {}
    text = " ".join(part.get("text", "") for part in result.get("content") or [])
    return outcome_of_parts(bool(result.get("isError")), text, result.get("structuredContent"), tag)


async def one_call(client: RawModern, op: Op, planned: plan.Planned, ledger: Ledger) -> None:
    """Create the task, cancel it at its moment, poll it until it ends."""
    arguments = plan.params_for(op.tag, planned)
    try:
        call = {"name": planned.capability, "arguments": arguments}
        created = await rpc(client, "tools/call", call)
        task: dict[str, Any] | None = {"status": "completed", "result": created}
        if created.get("resultType") == "task":  # else answered in place, as a plain call
            task = await _followed(client, created["taskId"], op, planned, ledger)
    except Told as told:
        op.told = str(told)
        ledger.note(op, f"told: {op.told}")
        return
    if task is None:
        op.give_up(ledger.now())
        return
    outcome, detail, ok = outcome_of(task, op.tag)
    ledger.answer(op, outcome, detail, data_ok=ok)


async def _followed(
    client: RawModern, task_id: str, op: Op, planned: plan.Planned, ledger: Ledger
) -> dict[str, Any] | None:
    ledger.note(op, f"task {task_id}")
    started = time.monotonic()
    cancel_at = None if planned.cancel_after is None else started + planned.cancel_after
    while time.monotonic() - started < POLL_FOR_SECONDS:
        if cancel_at is not None and time.monotonic() >= cancel_at:
            cancel_at = None
            op.cancelled_at = ledger.now()
            ledger.count(DOOR, "cancels")
            ledger.note(op, f"tasks/cancel ({op.cancel_plan})")
            await _again_if_refused(client, "tasks/cancel", task_id, op, ledger)
        task = await _again_if_refused(client, "tasks/get", task_id, op, ledger)
        if task is not None and task["status"] in ENDED:
            return task
        wait = (
            POLL_SECONDS if cancel_at is None else min(POLL_SECONDS, cancel_at - time.monotonic())
        )
        await asyncio.sleep(max(wait, 0.0))
    return None


async def _again_if_refused(
    client: RawModern, method: str, task_id: str, op: Op, ledger: Ledger
) -> dict[str, Any] | None:
    """A task's request; None if refused now (its Daphne or PostgreSQL restarting): the
    task lives on in the server, so the client asks again at its next poll."""
    try:
        return await rpc(client, method, {"taskId": task_id})
    except Told as told:
        ledger.note(op, f"{told}; asking again")
        return None


async def lane(url: str, key: str, ctx: Lane, *, pace: float) -> None:
    """Tasks at random intervals until the stop; then the ones still out, polled to the end."""
    ledger = ctx.ledger
    calls: dict[asyncio.Task[None], Op] = {}
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawModern(http, url, key, tasks=True)
        while not ctx.stop.is_set():
            planned = plan.next_call(ctx.rng, ctx.mix)
            op = ledger.new(DOOR, planned.capability, planned.cancel_plan, None)
            calls[asyncio.create_task(one_call(client, op, planned, ledger))] = op
            await ctx.pause(pace)
        await settle(calls, ledger)
