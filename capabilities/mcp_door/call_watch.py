"""Waiting on one call from the MCP door, which has no consumer of its own.

The watcher joins its session's channel-layer group on a channel of its own before
the job exists, so no note can slip past: progress and the settle reach it as
they reach an ABP consumer. Notes can be lost (a Redis hiccup); the outcome is in
the database, so a quiet spell ends with a look there. A call this Daphne's local lane
runs is answered as the WebSocket doors answer theirs (`deliver_here`): one statement
settles it and claims its delivery, and the response goes straight to the waiting
call, with no trip through the channel layer and no second claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from capabilities.calls import job_writes, session_records
from capabilities.jobs import lifecycle
from capabilities.jobs.notes import Note
from capabilities.models import Job, session_group

logger = logging.getLogger(__name__)

# A call with no note for this long looks in the database for its outcome.
QUIET_SECONDS = 5.0


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
        self._answered: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.watching = True

    async def deliver_here(
        self, job: Job, outcome: lifecycle.Outcome, response: dict[str, Any]
    ) -> bool:
        """Settle the watched call's local run and answer it here (`local_lane.Deliver`)."""
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
            except DatabaseError:
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
    except (redis.RedisError, OSError) as error:
        raise CannotWatch from error
    watch = CallWatch(session_id, channel)
    try:
        yield watch
    finally:
        watch.watching = False
        try:
            await layer.group_discard(group, channel)
        finally:
            # Its last receive may have returned: channels_redis would keep it for good
            # (capabilities/channel_layer.py); the in-memory layer forgets on its own.
            delete_channel = getattr(layer, "delete_channel", None)
            if delete_channel is not None:
                await delete_channel(channel)


def _progress_of(note: Note) -> Progress:
    return Progress(
        progress=float(note.get("progress") or 0),
        total=note.get("total"),
        stage=str(note.get("stage") or ""),
        position=note.get("position"),
    )
