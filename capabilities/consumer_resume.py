"""Holding a session across connections: take it over, let it go, keep it alive.

A mixin of ABPConsumer (capabilities/consumers.py); the durable side is in
capabilities/resumption.py. A dropped socket detaches its session; `initialize`
with `resume` on any Daphne takes it over and gets its calls back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.utils import timezone

from capabilities import resumption
from capabilities.models import session_group
from capabilities.protocol import ErrorCode
from capabilities.session import InFlight, ResumeSession

if TYPE_CHECKING:
    from capabilities import ws_auth
    from capabilities.session import Action, Session


class ResumeMixin:
    """Resume, detach, takeover and keep-alive for ABPConsumer."""

    if TYPE_CHECKING:
        channel_layer: Any
        channel_name: str
        principal: ws_auth.Principal | None
        session: Session
        serial: asyncio.Lock
        socket_gone: bool
        group: str | None
        generation: int
        superseded: bool
        detached: bool
        keep_alive: asyncio.TimerHandle | None
        started: dict[str, float]

        async def perform(self, actions: list[Action], *, connected: bool = True) -> None: ...
        async def deliver(self, call_id: str, response: dict[str, Any] | None = None) -> None: ...
        def in_background(self, work: Coroutine[Any, Any, Any]) -> None: ...
        def time_out_at(self, call_id: str, delay: float) -> None: ...
        def stop_timers(self) -> None: ...

    async def resume_session(self, action: ResumeSession) -> None:
        """Take over a session: its calls in flight, and its results not yet delivered."""
        assert self.principal is not None
        try:
            group = session_group(action.session_id)
        except ValueError:
            refused = resumption.ResumeRefused(
                ErrorCode.SESSION_INVALID, "This session cannot be resumed."
            )
            await self.perform(self.session.resume_refused(action, refused.error))
            return
        # Joined before the session's jobs are read: no settle falls in between.
        await self.channel_layer.group_add(group, self.channel_name)
        replacement = resumption.new_token()
        try:
            resumed = await database_sync_to_async(resumption.resume)(
                action.session_id, action.token, self.principal, replacement
            )
        except resumption.ResumeRefused as refused:
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.perform(self.session.resume_refused(action, refused.error))
            return
        self.group, self.generation = group, resumed.generation
        if resumed.was_held:
            # Its old connection may linger (a half-open socket, another Daphne).
            await self.channel_layer.group_send(
                group, {"type": "session.superseded", "generation": resumed.generation}
            )
        calls = [
            InFlight(
                call_id=job.call_id,
                request_id=job.request_id,
                job_id=str(job.id),
                progress_token=job.progress_token,
            )
            for job in resumed.jobs
        ]
        await self.perform(self.session.resumed(action, token=replacement, calls=calls))
        self.schedule_keep_alive()
        for job in resumed.jobs:
            if job.is_active:
                assert job.deadline is not None
                self.started[job.call_id] = time.monotonic()
                self.time_out_at(job.call_id, (job.deadline - timezone.now()).total_seconds())
            else:
                await self.deliver(job.call_id)

    async def detach(self) -> None:
        """The socket dropped: the session stays, for a resume within the grace period."""
        self.detached = True
        if self.session.session_id is not None:
            self.in_background(
                database_sync_to_async(resumption.detach)(self.session.session_id, self.generation)
            )

    def schedule_keep_alive(self) -> None:
        """Say every few seconds that this connection still holds the session."""
        session_id = self.session.session_id
        if session_id is None or self.socket_gone:
            return

        def tick() -> None:
            self.in_background(
                database_sync_to_async(resumption.keep_alive)(session_id, self.generation)
            )
            self.schedule_keep_alive()

        self.keep_alive = asyncio.get_running_loop().call_later(
            resumption.keep_alive_interval(), tick
        )

    # -- a note from the connection that resumed this session (channel layer) ----------

    async def session_superseded(self, event: dict[str, Any]) -> None:
        """Another connection resumed this session: hand it over without a word."""
        if event["generation"] <= self.generation:
            return  # our own announcement, or an older one
        async with self.serial:
            self.superseded = True
            self.stop_timers()
            await self.perform(self.session.superseded())
