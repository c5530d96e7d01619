"""The Python client's door: `abp_jobs_client.AsyncClient` through the proxy, which
resumes its session on its own after a drop (a fault's, or its own: the lane cuts its
TCP connection every ~`drop_every` s). Each call is `start`, maybe `cancel` at its
moment, then `result()`: a Result, or the typed error the client raised."""

from __future__ import annotations

import asyncio
import contextlib
import time

from abp_jobs_client import AsyncClient
from abp_jobs_client.errors import ABPError

from tests.support.soak import plan
from tests.support.soak.doors.lane import Lane
from tests.support.soak.doors.pending import settle
from tests.support.soak.ledger import Ledger, Op, names_call, outcome_of_error

DOOR = "client"
# Client errors that say the session, not the call, is gone: the client was told why.
SESSION_ERRORS = {"DISCONNECTED", "SESSION_INVALID", "SESSION_EXPIRED", "TRANSPORT_ERROR"}


async def one_call(client: AsyncClient, op: Op, planned: plan.Planned, ledger: Ledger) -> None:
    """Start a call, cancel it at its moment, and record its result or error."""
    timeout = None if planned.timeout_ms is None else planned.timeout_ms / 1000
    params = plan.params_for(op.tag, planned)
    try:
        handle = await client.start(planned.capability, params, timeout=timeout, call_id=op.tag)
        if planned.cancel_after is not None:
            await asyncio.sleep(planned.cancel_after)
            if not handle.done() or op.cancel_plan == "race":
                op.cancelled_at = ledger.now()
                ledger.count(DOOR, "cancels")
                ledger.note(op, f"cancel sent ({op.cancel_plan})")
                with contextlib.suppress(ABPError):
                    confirmed = await handle.cancel()
                    ledger.note(op, f"cancel confirmed: cancelled={confirmed.get('cancelled')}")
        result = await handle.result()
    except ABPError as error:
        if error.code in SESSION_ERRORS:
            op.told = f"{error.code}: {error}"
            ledger.note(op, f"told: {op.told}")
            return
        wire = {"code": error.code, "retryable": error.retryable}
        ledger.answer(op, outcome_of_error(wire), {"error": wire})
        return
    ledger.answer(op, "succeeded", {}, data_ok=names_call(op.tag, result.data))


def drop(client: AsyncClient, ledger: Ledger) -> None:
    """Cut the client's TCP connection, no close frame: it must resume on its own."""
    ws = client._ws  # the soak plays the network
    if ws is not None and ws.transport is not None:
        ws.transport.abort()
        ledger.count(DOOR, "drops")


async def lane(url: str, key: str, ctx: Lane, *, pace: float, drop_every: float) -> None:
    """One client making calls concurrently until the stop; a new client if it fails."""
    ledger = ctx.ledger
    next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
    while not ctx.stop.is_set():
        calls: dict[asyncio.Task[None], Op] = {}
        try:
            async with AsyncClient(
                url, key=key, agent_name="soak", resume_grace_seconds=120
            ) as client:
                ledger.count(DOOR, "sessions")
                while not ctx.stop.is_set():
                    planned = plan.next_call(ctx.rng, ctx.mix)
                    op = ledger.new(
                        DOOR, planned.capability, planned.cancel_plan, planned.timeout_ms
                    )
                    op.session = client.session_id or ""
                    calls[asyncio.create_task(one_call(client, op, planned, ledger))] = op
                    await ctx.pause(pace)
                    if time.monotonic() > next_drop:
                        drop(client, ledger)
                        next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
                await settle(calls, ledger)
        except ABPError as failed:
            ledger.count(DOOR, f"sessions failed: {failed.code}")
        if not ctx.stop.is_set():
            await asyncio.sleep(1.0)
