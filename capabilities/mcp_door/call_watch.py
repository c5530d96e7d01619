"""Waiting on one call from the MCP door, which has no consumer of its own.

The watcher joins its session's channel-layer group on a channel of its own before
the job exists, so no note can slip past: progress and the settle reach it as
they reach an ABP consumer. Notes can be lost (a Redis hiccup); the outcome is in
the database, so a quiet spell ends with a look there. A call this Daphne's local lane
runs is answered as the WebSocket doors answer theirs (`deliver_here`): one statement
settles it and claims its delivery, and the response goes straight to the waiting
call, with no trip through the channel layer and no second claim.

A stateful MCP session listens in its group too, for the note that its access was
withdrawn (a key revoked, a user deactivated: endings/access_withdrawal.py). Its calls
were settled as cancelled before the note was sent: each waiting call is given a
moment to answer so, then the session closes as if its client had gone away, and
the next request naming it is told it is not found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError
from mcp.server.connection import Connection

from capabilities.calls import job_writes, session_records
from capabilities.jobs import lifecycle, outages
from capabilities.jobs.notes import Note
from capabilities.mcp_door import sdk_seams
from capabilities.models import Job, session_group
from capabilities.protocol.closes import WITHDRAWN_BECAUSE

logger = logging.getLogger(__name__)

# A call with no note for this long looks in the database for its outcome.
QUIET_SECONDS = 5.0
# A withdrawn session's waiting calls are answered (cancelled) within this, usually at
# once; then an answer handed to the SDK is given this long to be written to its stream.
ANSWER_GRACE_SECONDS = 1.0
LINGER_SECONDS = 0.2
WITHDRAWN = "agent.key_revoked"
# The calls each session waits on here, and the sessions listening for a withdrawal.
_watches: dict[str, set[CallWatch]] = {}
_listening: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, kw_only=True)
class Progress:
    """A progress note of the watched call."""

    progress: float
    total: float | None
    stage: str
    position: int | None


ProgressSink = Callable[[Progress], Awaitable[None]]


class CallWatch:
    """A channel of its own in a session's group; notes of other calls are skipped."""

    def __init__(self, session_id: str, channel: str) -> None:
        self.session_id = session_id
        self._channel = channel
        self._layer: Any = get_channel_layer()
        loop = asyncio.get_running_loop()
        self._answered: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self.watching = True

    async def deliver_here(
        self, job: Job, outcome: lifecycle.Outcome, response: dict[str, Any]
    ) -> bool:
        """Settle the watched call's local run and answer it here (`lane_runs.Deliver`)."""
        if not self.watching or self._answered.done():
            return False
        won = await job_writes.settle(
            job_writes.LocalSettle(job=job, outcome=outcome, response=response, answered_here=True)
        )
        if not won:  # whoever settled it first told the group: the note answers it
            return True
        if self.watching and not self._answered.done():
            self._answered.set_result(response)
        else:  # the call stopped waiting meanwhile: its result stays to be read
            await database_sync_to_async(lifecycle.release_delivery)(job.id)
        return True

    async def note(self, quiet_for: float) -> Note | None:
        """The session's next note; None after `quiet_for` seconds without one, or answered."""
        receiving = asyncio.ensure_future(self._layer.receive(self._channel))
        try:
            done, _ = await asyncio.wait(
                {receiving, self._answered}, timeout=quiet_for, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not receiving.done():
                receiving.cancel()  # the layer's queue keeps a note it had not handed out
        if receiving in done:
            note: Note = receiving.result()
            return note
        return None

    async def outcome(
        self,
        job: Job,
        *,
        base_url: str,
        inline_max_bytes: int | None = None,
        on_progress: ProgressSink | None = None,
    ) -> dict[str, Any]:
        """Wait for the job to settle; its ABPResponse, claimed for this caller."""
        job_id, call_id = str(job.id), job.call_id
        while True:
            if self._answered.done():
                return self._answered.result()
            note = await self.note(QUIET_SECONDS)
            if note is None and self._answered.done():
                continue
            response: dict[str, Any] | None = None
            if note is not None:
                kind = note.get("type")
                if kind == "job.progress" and note.get("call_id") == call_id:
                    if on_progress is not None:
                        await on_progress(_progress_of(note))
                    continue
                mine = note.get("call_id") == call_id or note.get("job_id") == job_id
                if kind not in ("job.settled", "job.returned") or not mine:
                    continue
                response = note.get("response")
            try:
                claimed = await database_sync_to_async(session_records.claim_response)(
                    job_id, base_url, response, inline_max_bytes=inline_max_bytes
                )
            except outages.DATABASE_AWAY:
                # PostgreSQL restarting: the job goes on, and so does the wait for it.
                logger.warning("Could not read call %s's outcome yet; trying again", call_id)
                continue
            if isinstance(claimed, dict):
                return claimed
            if claimed is session_records.NotClaimed.DELIVERED_ELSEWHERE:
                # Nobody else answers this door's calls; a claim that raced a lookup.
                found: dict[str, Any] | None = await database_sync_to_async(
                    session_records.settled_response
                )(job_id, base_url)
                if found is not None:
                    return found


class CannotWatch(Exception):
    """The channel layer is out of reach (Redis restarting): no call can be watched."""


@contextlib.asynccontextmanager
async def watching(session_id: str) -> AsyncIterator[CallWatch]:
    """A CallWatch in the session's group, for as long as the block runs; CannotWatch
    before the block if the layer cannot be reached."""
    layer: Any = get_channel_layer()
    group = session_group(session_id)
    try:
        channel: str = await layer.new_channel("abp.call.")
        await layer.group_add(group, channel)
    except outages.REDIS_AWAY as error:
        raise CannotWatch from error
    watch = CallWatch(session_id, channel)
    _watches.setdefault(session_id, set()).add(watch)
    try:
        yield watch
    finally:
        watch.watching = False
        _watches[session_id].discard(watch)
        if not _watches[session_id]:
            del _watches[session_id]
        watch.ended.set_result(None)
        await _leave(layer, group, channel)


async def _leave(layer: Any, group: str, channel: str) -> None:
    try:
        await layer.group_discard(group, channel)
    finally:
        # Its last receive may have returned: channels_redis would keep it for good
        # (capabilities/channel_layer.py); the in-memory layer forgets on its own.
        delete_channel = getattr(layer, "delete_channel", None)
        if delete_channel is not None:
            await delete_channel(channel)


def close_when_withdrawn(session_id: str, connection: Connection) -> asyncio.Task[None]:
    """Listen, until cancelled, for the withdrawal of this stateful session's access;
    then close it. The task to cancel when the session ends."""
    task = asyncio.get_running_loop().create_task(_close_when_withdrawn(session_id, connection))
    _listening.add(task)
    task.add_done_callback(_listening.discard)
    return task


async def _close_when_withdrawn(session_id: str, connection: Connection) -> None:
    reason = await _withdrawal(session_id)
    waiting = [watch.ended for watch in _watches.get(session_id, ())]
    if waiting:
        await asyncio.wait(waiting, timeout=ANSWER_GRACE_SECONDS)
        await asyncio.sleep(LINGER_SECONDS)
    try:
        await database_sync_to_async(session_records.close_session)(
            session_id, WITHDRAWN_BECAUSE[reason]
        )
    except DatabaseError:
        logger.warning("MCP session %s closes; its row is left to the reaper", session_id)
    if await sdk_seams.end_connection(connection):
        logger.info("MCP session %s closed: %s", session_id, reason)
    else:
        logger.error("MCP session %s could not be closed: its transport is unknown", session_id)


async def _withdrawal(session_id: str) -> str:
    """The close reason of the first withdrawal note to the session's group.

    While Redis is away notes are lost (the reaper sends them again): keep trying.
    """
    layer: Any = get_channel_layer()
    group = session_group(session_id)
    while True:
        try:
            channel: str = await layer.new_channel("abp.withdrawn.")
            await layer.group_add(group, channel)
        except outages.REDIS_AWAY:
            logger.warning("MCP session %s cannot listen for withdrawals yet", session_id)
            await asyncio.sleep(QUIET_SECONDS)
            continue
        try:
            while (note := await layer.receive(channel)).get("type") != WITHDRAWN:
                pass
            return str(note.get("reason") or "key-revoked")
        finally:
            await _leave(layer, group, channel)


def _progress_of(note: Note) -> Progress:
    return Progress(
        progress=float(note.get("progress") or 0),
        total=note.get("total"),
        stage=str(note.get("stage") or ""),
        position=note.get("position"),
    )
