"""The WebSocket consumer at /abp/ws: the session's I/O shell.

Decode, hand to the session (capabilities/session/machine.py), perform what it
returns, report what the I/O found, then let it replay what it held back. It writes
no envelope, decides no outcome and waits on no call: the session's call table
holds what must wait (capabilities/session/calls.py). Events are handled one at a
time (a lock). A call's row is written in a task of its own, off the lock, so that
a cancel right behind the call is read at once (capabilities/calls/start_ticket.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from capabilities.access import credentials
from capabilities.calls import draining, manifest, start
from capabilities.calls.app_info import app_info
from capabilities.calls.start_order import StartOrder, StartTurn
from capabilities.calls.start_ticket import StartTicket
from capabilities.endings import cancellation
from capabilities.endings.background import Background
from capabilities.jobs import lifecycle, outages
from capabilities.lane import lane
from capabilities.models import Door, Job
from capabilities.protocol import CancelPendingRequest, CancelRequest, Message, decode, replies
from capabilities.protocol import ProtocolError as Refused
from capabilities.session import actions as do
from capabilities.session.machine import Session
from capabilities.session.wire import Wire
from capabilities.transport import admission, availability_watch, takeover_notice
from capabilities.transport.call_timers import Timers
from capabilities.transport.session_groups import SessionGroups
from capabilities.transport.session_io import SessionIO
from capabilities.transport.websocket_base import WebsocketBase

logger = logging.getLogger(__name__)

# RFC 6455's "Try Again Later": the server could not check the credential now.
TRY_AGAIN_LATER = 1013
# RFC 6455's "Service Restart": this instance is stopping, resume on another.
SERVICE_RESTART = 1012


class ABPConsumer(WebsocketBase):
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

    async def connect(self) -> None:
        await availability_watch.ensure_started()
        lane.start_soon()
        # Everything until the credential is known; then what its principal may call.
        self.visible: frozenset[str] | None = None
        self.session = Session(
            capability_names=start.capability_names,
            app=app_info(),
            wire=self.wire,
            describe=lambda: manifest.capability_entries(availability_watch.states()),
            shown=lambda name: self.visible is None or name in self.visible,
            availability=availability_watch.states,
        )
        self.serial = asyncio.Lock()
        self.background = Background()
        self.tickets: dict[str, StartTicket] = {}
        self.order = StartOrder()
        self.timers = Timers(self.background, self.on_timer)
        self.listening = SessionGroups(self.channel_layer, self.channel_name)
        if draining.is_draining():
            # This instance is stopping: the client resumes on another at once.
            await self.accept_and_close(SERVICE_RESTART)
            return
        prefix = credentials.key_prefix_presented(self.scope)
        if prefix is not None:  # heard before the key is checked: a racing revoke is too
            await self.listening.hear_key(prefix)
        subprotocol = credentials.selected_subprotocol(self.scope)
        try:
            admitted = await admission.admit(self.scope)
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
        self.visible = admitted.visible
        self.io = SessionIO(
            self.session,
            admitted.principal,
            base_url=admitted.base_url,
            door=self.door,
            groups=self.listening,
        )
        await self.perform(self.session.accepted(admitted.limits))
        await self.accept(subprotocol=subprotocol)

    async def accept_and_close(self, code: int) -> None:
        """Accept the handshake only to close at once with `code`: the client learns why."""
        await self.accept(subprotocol=credentials.selected_subprotocol(self.scope))
        await self.close(code=code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # Frames over ABP_MAX_FRAME_BYTES never get here: Daphne closes with 1009.
        frame: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        try:
            message: Message | Refused | None = self.read_frame(frame)
        except Refused as error:
            message = error
        if message is None:
            return
        if not isinstance(message, (CancelRequest, CancelPendingRequest)):
            await self.close_stale_connections()
        await self.handle(self.session.receive, message)

    async def handle(self, event: Callable[..., list[do.Action]], *args: Any) -> None:
        """Hand one event to the session; perform its actions, then what it held back."""
        async with self.serial:
            await self.perform(event(*args))
            while (held := self.session.replay()) is not None:
                await self.perform(held)

    async def disconnect(self, code: int) -> None:
        async with self.serial:
            self.closed = True
            self.session.socket_gone()
        # Held by the session until every start has reported (the starts report it).
        await self.handle(self.session.disconnected, code)
        # Starts, deliveries given back, revokes: done before the session is let go.
        await self.background.drain()
        await self.listening.leave()

    async def on_timer(self, call_id: str) -> None:
        await self.handle(self.session.timed_out, call_id)

    # -- performing the session's actions --------------------------------------------

    async def perform(self, actions: list[do.Action]) -> None:
        """Carry out actions in order; what one finds is performed before the next."""
        for action in actions:
            await self.perform(await self.perform_one(action))

    async def perform_one(self, action: do.Action) -> list[do.Action]:
        """Perform one action; the session's answer to what it found."""
        match action:
            case do.Send():
                sent = await self.send_frame(action.text)
                return [] if sent else self.session.send_dropped(action.claims)
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
                self.listening.let_go()
                self.background.run(self.io.detach(action.session_id, action.generation))
            case do.LetGo():
                self.listening.let_go()
            case do.AnnounceTakeover():
                told = (self.channel_layer, action.session_id, action.generation)
                if not await takeover_notice.announce(*told):
                    # The reply with the new token goes out all the same.
                    self.background.run(takeover_notice.keep_announcing(*told))
            case do.OpenSession():
                return await self.io.open_session(action, credentials.origin_of(self.scope))
            case do.ResumeSession():
                return await self.io.resume(action)
            case do.StartCall():
                ticket = self.tickets[action.call_id] = StartTicket()
                self.background.run(self.start_call(action, ticket, self.order.turn()))
            case do.CancelStart():
                pending = self.tickets.get(action.call_id)
                won = pending is not None and pending.cancel(action.reason)
                return self.session.start_ticket(action, won)
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
        report = await self.io.start_call(action, ticket, self.deliver_here, turn)
        await self.handle(report)
        if self.tickets.get(action.call_id) is ticket:
            del self.tickets[action.call_id]

    async def deliver_here(
        self, job: Job, outcome: lifecycle.Outcome, response: dict[str, Any]
    ) -> bool:
        """Answer a local run's call from here, if this connection holds it."""
        async with self.serial:
            if not self.session.answers(job.call_id):
                return False
            await self.perform(await self.io.settle_here(job, outcome, response))
            return True

    # -- notes from workers, the reaper, the admin, other connections ----------------

    async def job_started(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.job_started, event["call_id"])

    async def job_progress(self, event: dict[str, Any]) -> None:
        keys = ("progress", "total", "stage", "position")
        at: dict[str, Any] = {key: event.get(key) for key in keys}
        await self.handle(functools.partial(self.session.job_progress, event["call_id"], **at))

    async def job_settled(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.job_settled, event["call_id"], event.get("response"))

    async def job_returned(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.job_returned, event["job_id"])

    async def session_superseded(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.superseded, event["generation"])

    async def capabilities_changed(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.capabilities_changed, event["available"])

    async def agent_key_revoked(self, event: dict[str, Any]) -> None:
        await self.handle(self.session.key_revoked, event.get("reason", "key-revoked"))
