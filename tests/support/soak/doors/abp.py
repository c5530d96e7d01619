"""The ABP WebSocket door: agents (tests/support/fleet.py's, with progress on) that make
calls and cancels, drop their own sockets and resume, and sessions whose key is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.support import fleet
from tests.support.soak import plan
from tests.support.soak.doors import resend
from tests.support.soak.doors.lane import Lane
from tests.support.soak.ledger import Ledger, Moment, Op, names_call, outcome_of_error

DOOR = "abp"
OUTLIVED = "sessions that outlived their revoked key"


class SoakAgent(fleet.AgentSession):
    """A fleet agent whose calls and answers go to the ledger as they happen."""

    initialize_payload = {
        **fleet.INITIALIZE,
        "agent": {"name": "soak", "version": "1.0"},
        "features": {"notifications": False, "progress": True},
    }

    def __init__(
        self, agents: fleet.Fleet, index: int, url: str, ledger: Ledger, door: str = DOOR
    ) -> None:
        super().__init__(agents, index, url)
        self.ledger = ledger
        self.door = door
        self.ops: dict[str, Op] = {}
        self.timeouts: dict[str, int] = {}
        self.gone = asyncio.Event()  # the session failed: its agent was told why
        self.refusal = ""  # what the server said when it refused the key
        self.attempts: list[str] = []  # every resume attempt, how it ended
        self._cancels: set[asyncio.Task[None]] = set()
        self._resuming = False  # a resume's socket is being opened
        self._dropped = False  # the last socket lost was the agent's own drop

    # -- resuming: see resend.py ----------------------------------------------------------

    def _resume_payload(self) -> dict[str, Any]:
        payload = super()._resume_payload()
        if resend.HELD_CALLS:
            payload["awaiting"] = resend.awaiting(self.calls)
        return payload

    def _calls_to_send_again(self, lost: set[int]) -> list[fleet.Call]:
        again = resend.to_send_again(self.calls, lost, self.initialized)
        for call in again:
            self.ledger.note(self.ops[call.call_id], "sent again after a resume")
        self.ledger.count(self.door, "resumes")
        return again

    def _call_payload(self, call: fleet.Call) -> dict[str, Any]:
        payload = super()._call_payload(call)
        options = payload["options"]
        if call.capability == plan.HEAVY:
            options["progressToken"] = call.call_id
        if call.call_id in self.timeouts:
            options["timeout"] = self.timeouts[call.call_id]
        if call.sends and resend.HELD_CALLS:
            options["resent"] = True
        return payload

    # -- frames -----------------------------------------------------------------------

    def _route(self, now: float, conn: fleet.Connection, message: fleet.Envelope) -> None:
        kind = message.get("type")
        payload = message.get("payload") or {}
        if kind == "progress":
            op = self.ops.get(str(payload.get("operationId")))
            if op is not None and op.answers:
                op.late_progress.append(self.ledger.now())
                self.ledger.note(op, f"progress after the answer: {payload.get('progress')}")
            if op is not None:
                return
        if kind == "notification" and payload.get("event") == "notifications/error":
            error = payload.get("data") or {}
            if error.get("code") == "PERMISSION_DENIED":
                self._refused(error)
                return
        op = self.ops.get(str(payload.get("callId", "")))
        if op is not None and kind == "capabilities/call-result":
            if fleet.is_reuse_refusal(message):
                self.ledger.note(op, "the call sent again was refused: the server had it")
            elif payload.get("success") is True:
                ok = names_call(op.tag, payload.get("data"))
                source = {"id": message.get("id"), "socket": conn.index}
                self.ledger.answer(op, "succeeded", source, data_ok=ok)
            else:
                error = payload.get("error")
                outcome = outcome_of_error(error, bool(payload.get("cancelled")))
                source = {"id": message.get("id"), "socket": conn.index, "error": error}
                self.ledger.answer(op, outcome, source)
        elif op is not None and kind == "capabilities/cancel-result":
            self.ledger.note(op, f"cancel-result cancelled={payload.get('cancelled')}")
        super()._route(now, conn, message)

    def _refused(self, error: dict[str, Any]) -> None:
        """The key was refused (revoked): no resume is tried again, nor one waiting."""
        self.ledger.count(self.door, "told the key was refused")
        self.refusal = f"{error.get('code')}: {error.get('message')}"
        for reply in self._replies.values():
            if not reply.done():
                reply.set_result({"payload": {"error": error}})

    async def _attach(self, url: str, *, resume: bool) -> None:
        if resume and self.refusal:
            raise fleet.SessionRefused(self.refusal)
        if not resume:
            await super()._attach(url, resume=resume)
            return
        # Each resume attempt and how it ended: the evidence when one is refused.
        self._resuming = True
        try:
            await super()._attach(url, resume=resume)
        except (
            OSError,
            ConnectionClosed,
            InvalidHandshake,
            TimeoutError,
            fleet.SessionRefused,
        ) as e:
            self.attempts.append(
                f"{self.ledger.now():.3f} resume failed: {type(e).__name__}: {e}"[:200]
            )
            raise
        finally:
            self._resuming = False
        self._dropped = False
        self.attempts.append(f"{self.ledger.now():.3f} resumed")

    async def _read(self, conn: fleet.Connection) -> None:
        # fleet.AgentSession._attach starts a socket's reader, then sends its initialize:
        # whoever waits for the resume runs once that frame has gone out.
        if self._resuming and not self._dropped:
            self.ledger.reached(Moment.RESUME_SENT, f"{self.door} session", session=self.session_id)
        await super()._read(conn)

    async def _recover(self) -> None:
        for op in self.unanswered():
            self.ledger.note(op, "socket lost")
        await super()._recover()
        if self.failure:
            self.gone.set()
            self.ledger.count(self.door, "sessions refused a resume")
            for attempt in self.attempts[-4:]:
                self.ledger.note_session(self.session_id, attempt)
            for op in self.unanswered():
                op.told = self.failure
                self.ledger.note(op, f"told: {self.failure}")

    def unanswered(self) -> list[Op]:
        """Calls sent and not answered yet."""
        return [op for op in self.ops.values() if not op.answers]

    # -- making calls -----------------------------------------------------------------

    async def make_call(self, planned: plan.Planned) -> Op:
        """Send one call (and schedule its cancel)."""
        op = self.ledger.new(self.door, planned.capability, planned.cancel_plan, planned.timeout_ms)
        op.session = self.session_id
        call = fleet.Call(
            self.index, op.tag, planned.capability, plan.params_for(op.tag, planned),
            planned.cancel_after,
        )  # fmt: skip
        self.calls[op.tag] = call
        self.ops[op.tag] = op
        if planned.timeout_ms is not None:
            self.timeouts[op.tag] = planned.timeout_ms
        try:
            await self._send_call(call)
        except fleet.SessionGone:
            op.told = self.failure
            raise
        if planned.cancel_after is not None:
            self.ledger.reached(Moment.CANCEL_DUE, op.tag, op=op, cancel_in=planned.cancel_after)
            task = asyncio.create_task(self._cancel_at(call, op, planned.cancel_after))
            self._cancels.add(task)
            task.add_done_callback(self._cancels.discard)
        return op

    async def _cancel_at(self, call: fleet.Call, op: Op, after: float) -> None:
        await asyncio.sleep(after)
        if op.answers and op.cancel_plan != "race":
            return
        with contextlib.suppress(fleet.SessionGone):
            await self._send_cancel(call)
            op.cancelled_at = self.ledger.now()
            self.ledger.note(op, f"cancel sent ({op.cancel_plan})")
            self.ledger.count(self.door, "cancels")

    def drop(self) -> bool:
        """Abort the socket (no close frame): the agent resumes on its own."""
        conn = self.current
        if conn is None:
            return False
        self.ledger.count(self.door, "drops")
        self._dropped = True
        for op in self.unanswered():
            self.ledger.note(op, "socket dropped by the agent")
        conn.ws.transport.abort()
        return True

    def settled_all(self) -> bool:
        """Every call answered, or the session gone."""
        return bool(self.failure) or (self.live.is_set() and not self.unanswered())


async def lane(agent: SoakAgent, ctx: Lane, *, pace: float, drop_every: float) -> None:
    """Calls at random intervals (mean `pace` s) and a dropped socket every ~`drop_every` s."""
    next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
    while not ctx.stop.is_set() and not agent.failure:
        try:
            await agent.make_call(plan.next_call(ctx.rng, ctx.mix))
        except fleet.SessionGone:
            break
        if time.monotonic() > next_drop:
            agent.drop()
            next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
        await ctx.pause(pace)


@dataclass(frozen=True)
class Keys:
    """How the revoked lane gets a key of its own, and revokes it."""

    make: Callable[[], Awaitable[tuple[fleet.Fleet, str]]]
    revoke: Callable[[str], Awaitable[None]]


async def revoked_lane(keys: Keys, ctx: Lane, agents_made: list[SoakAgent]) -> None:
    """Sessions on a key of their own, each revoked while its heavy calls run."""
    ledger, rng = ctx.ledger, ctx.rng
    mix = plan.Mix(heavy=0.7, cancel_heavy=0.0, timeout_heavy=0.0, cancel_small=0.0)
    while not ctx.stop.is_set():
        agents, key = await keys.make()
        agent = SoakAgent(agents, 1000 + len(agents_made), agents.urls[0], ledger, DOOR)
        agents_made.append(agent)
        try:
            await agent.open()
        except (
            fleet.SessionRefused, OSError, InvalidHandshake, TimeoutError, ConnectionClosed,
        ) as refused:  # fmt: skip
            ledger.count(DOOR, f"revocable session not opened: {type(refused).__name__}")
            await asyncio.sleep(5)
            continue
        until = time.monotonic() + rng.uniform(5, 20)
        while time.monotonic() < until and not ctx.stop.is_set() and not agent.failure:
            with contextlib.suppress(fleet.SessionGone):
                await agent.make_call(plan.next_call(rng, mix))
            await asyncio.sleep(rng.uniform(0.2, 1.0))
        for op in agent.unanswered():
            ledger.note(op, "its key is being revoked")
        for attempt in range(5):  # a fault may have the command fail: try again
            try:
                await keys.revoke(key)
                ledger.note_session(agent.session_id, f"{ledger.now():.3f} key revoked")
                break
            except RuntimeError as failed:
                why = str(failed).strip().splitlines()[-1:] or [""]
                ledger.note_session(agent.session_id, f"{ledger.now():.3f} revoke failed: {why[0]}")
                await asyncio.sleep(2.0 * (attempt + 1))
        ledger.count(DOOR, "keys revoked")
        try:  # told, or given up trying to resume (fleet.py: 40 tries)
            await asyncio.wait_for(agent.gone.wait(), 90)
        except TimeoutError:
            ledger.count(DOOR, OUTLIVED)
            ledger.note_session(
                agent.session_id, f"{ledger.now():.3f} still open 90 s after its key was revoked"
            )
        await agent.close()
