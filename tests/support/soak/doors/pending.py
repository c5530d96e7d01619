"""Calls still out when a door stops: waited for, then given up (a violation)."""

from __future__ import annotations

import asyncio

from tests.support.soak.ledger import Ledger, Op

SETTLE_SECONDS = 45.0  # as run.DRAIN_SECONDS


async def settle(calls: dict[asyncio.Task[None], Op], ledger: Ledger) -> None:
    """Wait for the calls still out (two minutes at most); the rest are given up."""
    pending = [task for task in calls if not task.done()]
    if pending:
        await asyncio.wait(pending, timeout=SETTLE_SECONDS)
    for task, op in calls.items():
        if not task.done():
            op.give_up(ledger.now())
