"""The sessions this Daphne process holds, said to be alive in one UPDATE at a time.

A session's `seen_at` tells the reaper someone still holds it (resumption.py). One
write per session every few seconds would be 25 writes a second for 500 sessions,
queued on the same thread as every cancel's settle; instead the process refreshes
all of its sessions with one statement per interval.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from capabilities.endings import resumption

logger = logging.getLogger(__name__)

# Consumer (channel name) -> the session it holds.
_held: dict[str, str] = {}
_tickers: dict[int, asyncio.Task[None]] = {}


def hold(holder: str, session_id: str) -> None:
    """`holder` (a consumer's channel name) now holds the session."""
    _held[holder] = session_id
    loop = asyncio.get_running_loop()
    ticker = _tickers.get(id(loop))
    if ticker is None or ticker.done():
        _tickers[id(loop)] = loop.create_task(_refresh_forever())


def release(holder: str) -> None:
    """`holder` let its session go (closed, detached, taken over)."""
    _held.pop(holder, None)


def held() -> list[str]:
    """Every session this process holds."""
    return sorted(set(_held.values()))


async def _refresh_forever() -> None:
    while True:
        await asyncio.sleep(resumption.keep_alive_interval())
        sessions = held()
        if not sessions:
            continue
        try:
            await database_sync_to_async(resumption.keep_alive)(sessions)
        except Exception:
            # Missing a beat is harmless unless it lasts the whole grace period.
            logger.warning("Could not refresh %d held sessions", len(sessions), exc_info=True)
