"""The WebSocket consumer at /abp/ws: the session's I/O shell.

It decodes frames, hands them to the session (capabilities/session/machine.py),
performs the actions it gets back, and reports what it found. It writes no
envelope and decides no outcome. Frames, notes and timers are handled one at a
time (a lock), so the session never sees interleaved updates. A call's job is
written off the lock (capabilities/transport/call_starts.py): a cancel may overtake
it, and everything else waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any, ClassVar

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.db import aclose_old_connections
from channels.generic.websocket import AsyncWebsocketConsumer

from capabilities.access import agent_keys, credentials, visibility
from capabilities.calls import draining, held_sessions, manifest, start
from capabilities.calls.app_info import app_info
from capabilities.calls.availability import AVAILABILITY_GROUP
from capabilities.calls.start_order import StartOrder, StartTurn
from capabilities.calls.start_ticket import StartTicket
from capabilities.conf import abp_settings
from capabilities.endings import cancellation, resumption
from capabilities.endings.background import Background
from capabilities.jobs import lifecycle, outages
from capabilities.lane import lane
from capabilities.models import Door, Job, session_group
from capabilities.protocol import (
    CallRequest,
    CancelPendingRequest,
    CancelRequest,
    Message,
    ProtocolError,
    WireError,
    decode,
    replies,
)
from capabilities.session import actions as do
from capabilities.session.machine import Session
from capabilities.session.wire import Wire
from capabilities.transport import availability_watch, takeover_notice
from capabilities.transport.call_starts import CallStarts
from capabilities.transport.call_timers import Timers
from capabilities.transport.session_io import SessionIO

logger = logging.getLogger(__name__)

# Frames that may overtake a call being started: they are what must not wait.
_OVERTAKING = (CancelRequest, CancelPendingRequest)
# Django closes stale database connections before each request; a connection checks at
# most this often (the database thread is the process's, shared by every connection).
CONNECTION_CHECK_SECONDS = 1.0
# RFC 6455's "Try Again Later": the server could not check the credential now.
TRY_AGAIN_LATER = 1013
# RFC 6455's "Service Restart": this instance is stopping, resume on another.
SERVICE_RESTART = 1012


def _base_url_of(scope: dict[str, Any]) -> str:
    """Where this agent reached us, for download URLs (http for ws, https for wss)."""
    host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{'https' if scope.get('scheme') == 'wss' else 'http'}://{host}"


def _describe() -> list[dict[str, Any]]:
    return manifest.capability_entries(availability_watch.states())


class ABPConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """One agent connection speaking the ABP envelope.

    The door's dialect is three class attributes: JSONRPCConsumer
    (capabilities/transport/rpc_consumer.py) reads and writes JSON-RPC instead.
    """

    door: ClassVar[Door] = Door.ABP
    wire: ClassVar[Wire] = replies

    @staticmethod
    def read_frame(frame: str | bytes) -> Message | None:
        """The frame's message (None: nothing to do); ProtocolError if refused."""
        return decode(frame)

    def _shown(self, name: str) -> bool:
        return self.visible is None or name in self.visible

    async def connect(self) -> None:
        await availability_watch.ensure_started()
        lane.start_soon()
        # Everything until the credential is known; then what its principal may call.
        self.visible: frozenset[str] | None = None
        self.session = Session(
            capability_names=start.capability_names,
            app=app_info(),
            wire=self.wire,
            describe=_describe,
            shown=self._shown,
            availability=availability_watch.states,
        )
        self.serial = asyncio.Lock()
        self.background = Background()
        self.starts = CallStarts()
        self.order = StartOrder()
        self.connections_checked_at = 0.0
        self.timers = Timers(self.background, self.on_timer)
        self.closed = False  # the socket, as far as this process knows
        self.group: str | None = None
        self.key_group: str | None = None
        if draining.is_draining():
            # This instance is stopping: the client resumes on another at once.
            await self.accept_and_close(SERVICE_RESTART)
            return
        prefix = credentials.key_prefix_presented(self.scope)
        if prefix is not None:
            # Joined before the key is checked: a revoke racing this connect is heard.
            self.key_group = agent_keys.key_group(prefix)
            await self.channel_layer.group_add(self.key_group, self.channel_name)
        subprotocol = credentials.selected_subprotocol(self.scope)
        try:
            principal = await credentials.authenticate_async(self.scope)
            self.visible = await visibility.names_for_async(principal)
        except credentials.Refused as refused:
            await self.accept(subprotocol=subprotocol)
            await self.perform(self.session.refuse(refused.reason))
            return
        except outages.DATABASE_AWAY:
            # The key could not be looked up (PostgreSQL restarting): 1013, try again
            # later, which every client reconnects (or resumes) after.
            logger.warning("Connection closed: the agent key could not be checked", exc_info=True)
            await self.accept_and_close(TRY_AGAIN_LATER)
            return
        base_url = abp_settings().PUBLIC_BASE_URL or _base_url_of(self.scope)
        self.io = SessionIO(self.session, principal, base_url=base_url, door=self.door)
        limits = do.Limits(
            max_queued_calls=principal.max_queued_calls,
            queue_full_retry_after_ms=abp_settings().QUEUE_FULL_RETRY_AFTER_MS,
            max_timeout_ms=functools.partial(start.max_timeout_ms, principal),
            # Pages resume too (client.js, bridge.js); a page that goes away ends its
            # session itself (pagehide), so only a dropped socket waits out the grace.
            resumable=resumption.grace().total_seconds() > 0,
        )
        await self.perform(self.session.accepted(limits))
        await self.accept(subprotocol=subprotocol)

    async def accept_and_close(self, code: int) -> None:
        """Accept the handshake only to close at once with `code`: the client learns why."""
        await self.accept(subprotocol=credentials.selected_subprotocol(self.scope))
        await self.close(code=code)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its hop to close stale database connections.

        Channels makes that hop to the process's one database thread before every
        message: a cancel would queue there behind the insert of the call before it,
        and every note would pay for it. Frames other than cancels close them in
        `receive` (at most once a second), and every `database_sync_to_async` hop
        does before its work; so a refused connect, decided on the loop
        (`credentials.authenticate_async`), waits on that thread neither to open
        nor to close.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # Frames over ABP_MAX_FRAME_BYTES never get here: Daphne closes with 1009.
        frame: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        try:
            message: Message | ProtocolError | None = self.read_frame(frame)
        except ProtocolError as error:
            message = error
        if message is None:
            return
        if not isinstance(message, _OVERTAKING):
            # A call may start while calls before it still start: their turns keep
            # them in order (calls/start_order.py). Any other frame waits for them, and
            # so does a call reusing the callId of one whose start (perhaps cancelled
            # already, its row still being written) is not reported yet.
            overtakes = isinstance(message, CallRequest) and not self.starts.starting(
                message.options.call_id
            )
            if not overtakes:
                await self.starts.settled()
            await self.close_stale_connections()
        else:
            await self.starts.deferred()
            if isinstance(message, CancelRequest):
                await self.starts.written_if_cancelled(message.call_id)
        await self.receive_message(message)

    async def close_stale_connections(self) -> None:
        """Django's per-request clean-up of database connections, at most once a second."""
        now = time.monotonic()
        if now - self.connections_checked_at >= CONNECTION_CHECK_SECONDS:
            self.connections_checked_at = now
            await aclose_old_connections()

    async def receive_message(self, message: Message | ProtocolError) -> None:
        async with self.serial:
            await self.perform(self.session.receive(message))

    async def disconnect(self, code: int) -> None:
        if self.key_group is not None:
            await self.channel_layer.group_discard(self.key_group, self.channel_name)
        await self.starts.settled()
        async with self.serial:
            self.closed = True
            self.session.socket_gone()
            await self.perform(self.session.disconnected(code))
            held_sessions.release(self.channel_name)
            if self.group is not None:
                await self.channel_layer.group_discard(self.group, self.channel_name)
                await self.channel_layer.group_discard(AVAILABILITY_GROUP, self.channel_name)
            # Deliveries given back, revokes: done before the session is let go.
            await self.background.drain()

    async def on_timer(self, call_id: str) -> None:
        async with self.serial:
            await self.perform(self.session.timed_out(call_id))

    # -- performing the session's actions --------------------------------------------

    async def perform(self, actions: list[do.Action]) -> None:
        """Carry out actions in order; what one finds is performed before the next."""
        for action in actions:
            await self.perform(await self.perform_one(action))

    async def perform_one(self, action: do.Action) -> list[do.Action]:
        """Perform one action; the session's answer to what it found."""
        match action:
            case do.Send():
                return (
                    []
                    if await self.send_frame(action.text)
                    else self.session.send_dropped(action.claims)
                )
            case do.Close():
                await self.close_socket(action.code)
                return self.session.socket_gone()
            case do.StartTimer():
                self.timers.start(action.call_id, action.seconds)
            case do.StopTimer():
                self.timers.stop(action.call_id)
            case do.StopTimers():
                self.timers.stop_all()
            case do.StopWork():
                self.background.run(await cancellation.stop_work_async(action.job_id))
            case do.GiveBack():
                self.background.run(self.io.give_back(action.job_id))
            case do.Detach():
                held_sessions.release(self.channel_name)
                self.background.run(self.io.detach(action.session_id, action.generation))
            case do.LetGo():
                held_sessions.release(self.channel_name)
            case do.AnnounceTakeover():
                told = (self.channel_layer, action.session_id, action.generation)
                if not await takeover_notice.announce(*told):
                    # The reply with the new token goes out all the same.
                    self.background.run(takeover_notice.keep_announcing(*told))
            case do.OpenSession():
                return await self.open_session(action)
            case do.ResumeSession():
                return await self.resume_session(action)
            case do.StartCall():
                start_call = functools.partial(self.start_call, action, turn=self.order.turn())
                self.starts.begin(action.call_id, start_call)
            case do.CancelStart():
                if action.overtakes and self.starts.cancel(action.call_id, action.reason):
                    return self.session.start_cancelled(action)
                # Its row is being written, or the call is a re-sent one whose first
                # copy may have a row: the cancel takes the usual path after its start.
                self.starts.after(action.call_id, self.receive_message(action.message))
            case do.SettleCancels():
                return await self.io.settle_cancels(action)
            case do.ClaimResult():
                return await self.io.claim_result(action)
            case do.LookUp():
                return await self.io.look_up(action)
            case do.FindUnanswered():
                return await self.io.find_unanswered(action)
            case do.EndSession():
                return await self.io.end_session(action)
        return []

    async def start_call(self, action: do.StartCall, ticket: StartTicket, turn: StartTurn) -> None:
        """Write the call's job (off the lock, in its turn), then report it to the session."""
        try:
            found = await self.io.start_call(action, ticket, self.deliver_here, turn)
        except Exception:
            logger.exception("Could not start call %s", action.call_id)
            found = start.NOT_QUEUED
        async with self.serial:
            if found is None:
                await self.perform(self.session.resent_call_held(action))
            elif isinstance(found, WireError):
                await self.perform(self.session.call_refused(action, found))
            else:
                await self.perform(self.session.call_started(found))

    async def deliver_here(
        self, job: Job, outcome: lifecycle.Outcome, response: dict[str, Any]
    ) -> bool:
        """Answer a local run's call from here, if this connection holds it."""
        async with self.serial:
            if not self.session.answers(job.call_id):
                return False
            await self.perform(await self.io.settle_here(job, outcome, response))
            return True

    async def send_frame(self, text: str) -> bool:
        """Send a frame; False if the socket is gone.

        A note can arrive after the socket closed and before Daphne delivers the
        disconnect; the frame is dropped (the outcome stays in the DB).
        """
        if self.closed:
            return False
        try:
            await self.send(text_data=text)
        except (Disconnected, OSError):  # autobahn's, or the server's "closed" (asgi.py)
            self.closed = True
            return False
        return True

    async def close_socket(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Disconnected):
                await self.close(code=code)

    async def open_session(self, action: do.OpenSession) -> list[do.Action]:
        refused = await self.io.open_session(action, credentials.origin_of(self.scope))
        if refused is not None:
            return refused
        await self.join(action.session_id)
        return self.session.opened(action)

    async def resume_session(self, action: do.ResumeSession) -> list[do.Action]:
        try:
            group = session_group(action.session_id)
        except ValueError:
            return self.session.resume_refused(resumption.invalid().error)
        # Joined before the session's jobs are read: no settle falls in between. And
        # before its token turns: a resume failing after that (Redis restarting) would
        # leave the agent with a token that no longer works.
        await self.listen(group)
        replacement = resumption.new_token()
        try:
            actions = await self.io.resume(action, replacement)
        except resumption.ResumeRefused as refused:
            await self.channel_layer.group_discard(group, self.channel_name)
            return self.session.resume_refused(refused.error)
        self.hold(action.session_id)
        return actions

    async def join(self, session_id: str) -> None:
        """Hold the session here, and hear its notes."""
        await self.listen(session_group(session_id))
        self.hold(session_id)

    async def listen(self, group: str) -> None:
        """Hear the session's notes, and workers coming and going."""
        await self.channel_layer.group_add(group, self.channel_name)
        await self.channel_layer.group_add(AVAILABILITY_GROUP, self.channel_name)

    def hold(self, session_id: str) -> None:
        """The session is this connection's."""
        self.group = session_group(session_id)
        held_sessions.hold(self.channel_name, session_id)

    # -- notes from workers, the reaper, the admin, other connections ----------------

    async def job_started(self, event: dict[str, Any]) -> None:
        await self.starts.reported(event["call_id"])
        await self.perform(self.session.job_started(event["call_id"]))

    async def job_progress(self, event: dict[str, Any]) -> None:
        await self.starts.reported(event["call_id"])
        progress = self.session.job_progress(
            event["call_id"],
            progress=event["progress"],
            total=event["total"],
            stage=event["stage"],
            position=event.get("position"),
        )
        await self.perform(progress)

    async def job_settled(self, event: dict[str, Any]) -> None:
        await self.starts.reported(event["call_id"])
        async with self.serial:
            await self.perform(self.session.job_settled(event["call_id"], event.get("response")))

    async def job_returned(self, event: dict[str, Any]) -> None:
        await self.starts.settled()
        async with self.serial:
            await self.perform(self.session.job_returned(event["job_id"]))

    async def session_superseded(self, event: dict[str, Any]) -> None:
        await self.starts.settled()
        if event["generation"] <= self.session.generation:
            return  # our own announcement, or an older one
        async with self.serial:
            await self.perform(self.session.superseded(event["generation"]))

    async def capabilities_changed(self, event: dict[str, Any]) -> None:
        await self.starts.settled()
        async with self.serial:
            await self.perform(self.session.capabilities_changed(event["available"]))

    async def agent_key_revoked(self, event: dict[str, Any]) -> None:
        await self.starts.settled()
        async with self.serial:
            await self.perform(self.session.key_revoked(event.get("reason", "key-revoked")))
