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

from capabilities import held_sessions, jobs, resumption, session_store
from capabilities.models import Job, session_group
from capabilities.protocol import ErrorCode
from capabilities.session import ResumeSession, SessionState

if TYPE_CHECKING:
    from capabilities import ws_auth
    from capabilities.layer import RetryingLayer
    from capabilities.session import Action, Session


class ResumeMixin:
    """Resume, detach, takeover and keep-alive for ABPConsumer."""

    if TYPE_CHECKING:
        layer: RetryingLayer
        channel_name: str
        principal: ws_auth.Principal | None
        session: Session
        serial: asyncio.Lock
        socket_gone: bool
        group: str | None
        generation: int
        superseded: bool
        detached: bool
        started: dict[str, float]

        async def perform(self, actions: list[Action], *, connected: bool = True) -> None: ...
        async def deliver(self, call_id: str, response: dict[str, Any] | None = None) -> None: ...
        def in_background(self, work: Coroutine[Any, Any, Any]) -> None: ...
        def time_out_at(self, call_id: str, delay: float) -> None: ...
        def stop_timers(self) -> None: ...
        async def close(self, code: int | None = None, reason: str | None = None) -> None: ...

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
        await self.layer.group_add(group, self.channel_name)
        replacement = resumption.new_token()
        try:
            resumed = await database_sync_to_async(resumption.resume)(
                action.session_id, action.token, self.principal, replacement
            )
        except resumption.ResumeRefused as refused:
            await self.layer.group_discard(group, self.channel_name)
            await self.perform(self.session.resume_refused(action, refused.error))
            return
        self.group, self.generation = group, resumed.generation
        if resumed.was_held:
            # Its old connection may linger (a half-open socket, another Daphne).
            await self.layer.group_send(
                group, {"type": "session.superseded", "generation": resumed.generation}
            )
        await self.perform(self.session.resumed(action, token=replacement, calls=[]))
        held_sessions.hold(self.channel_name, action.session_id)
        for job in resumed.jobs:
            self.adopt(job)
            if not job.is_active:
                await self.deliver(job.call_id)

    def holds_session(self) -> bool:
        """This connection holds an open session and can still send to the agent."""
        return (
            not self.socket_gone
            and self.session.state is SessionState.OPEN
            and self.session.session_id is not None
        )

    def adopt(self, job: Job) -> None:
        """Make a call of this session this connection's to answer (and to time out)."""
        self.session.call_started(
            call_id=job.call_id,
            request_id=job.request_id,
            job_id=str(job.id),
            progress_token=job.progress_token,
        )
        if job.is_active:
            assert job.deadline is not None
            self.started[job.call_id] = time.monotonic()
            self.time_out_at(job.call_id, (job.deadline - timezone.now()).total_seconds())

    async def adopt_undelivered(self) -> None:
        """Hold every unanswered call of the session (before a shutdown ends them all).

        Besides this connection's own calls, the session may have some that another
        of its connections created or gave back a moment ago.
        """
        if self.socket_gone or self.session.session_id is None:
            return
        pending = await database_sync_to_async(session_store.undelivered_jobs)(
            self.session.session_id
        )
        for job in pending:
            if self.session.in_flight(job.call_id) is None:
                self.adopt(job)

    async def adopt_unknown(self, call_id: str) -> bool:
        """A call of this session that this connection does not hold yet: hold it?

        Another connection of the session may have created it (its call frame came
        in as the agent dropped it and resumed here) or given its result back.
        True if the call is not answered yet and is now this connection's.
        """
        if not self.holds_session() or self.session.in_flight(call_id) is not None:
            return False
        assert self.session.session_id is not None
        job = await database_sync_to_async(jobs.find_call)(self.session.session_id, call_id)
        if job is None or job.delivered_at is not None:
            return False
        self.adopt(job)
        return True

    async def detach(self) -> None:
        """The socket dropped: the session stays, for a resume within the grace period."""
        self.detached = True
        held_sessions.release(self.channel_name)
        if self.session.session_id is not None:
            self.in_background(
                database_sync_to_async(resumption.detach)(self.session.session_id, self.generation)
            )

    # -- a note from the connection that resumed this session (channel layer) ----------

    async def session_superseded(self, event: dict[str, Any]) -> None:
        """Another connection resumed this session: close, and hand it over."""
        if event["generation"] <= self.generation:
            return  # our own announcement, or an older one
        async with self.serial:
            self.superseded = True
            held_sessions.release(self.channel_name)
            self.stop_timers()
            # Frames this socket already brought in are still handled: the session is
            # open, only this socket is not. A call the agent sent just before it
            # resumed elsewhere is created, and its result goes to the new holder.
            await self.close(code=4409)

    # -- a result another connection of this session could not send (channel layer) ----

    async def job_returned(self, event: dict[str, Any]) -> None:
        """Take over a result its connection gave back (jobs.release_delivery)."""
        async with self.serial:
            if not self.holds_session():
                return  # a resume will find it
            assert self.session.session_id is not None
            job = await database_sync_to_async(session_store.find_job)(
                self.session.session_id, event["job_id"]
            )
            if job is not None and await self.adopt_unknown(job.call_id):
                await self.deliver(job.call_id)
