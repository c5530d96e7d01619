"""The JSON-RPC door (/abp/rpc): `_abp/call`, `_abp/cancel` and `$/cancel_request`, over
sockets that drop and resume (`initialize._meta["abp/resume"]`).

A call answered on an earlier socket of the session arrives as `_abp/result`; a call
whose request died unread with its socket is sent again under a new request id with the
same callId (refused as a reused callId if the server had it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.support.soak import plan
from tests.support.soak.doors.lane import Lane
from tests.support.soak.ledger import Ledger, Moment, Op, names_call, outcome_of_error

DOOR = "rpc"
Message = dict[str, Any]


@dataclass
class RpcCall:
    """One call: the op, the request ids it went under, and the connection of the last."""

    op: Op
    body: dict[str, Any]
    request_ids: list[int] = field(default_factory=list)
    connection: int = 0
    sending: bool = False  # a request of it waits for a live socket


def to_send_again(calls: Iterable[RpcCall], held: set[str], connection: int) -> list[RpcCall]:
    """After a resume onto `connection`: the calls whose request died unread.

    Unanswered, not held by the server, and last sent on an earlier socket. A call
    sent on this one, or still waiting to be sent, is not lost: sending it again too
    would make two calls of one callId (and a call refused before its row, which the
    server then does not hold, would be answered twice: the 11:55 soak's `rpc-4629`).
    """
    return [
        call
        for call in calls
        if not call.op.answers
        and call.op.tag not in held
        and not call.sending
        and 0 < call.connection < connection
    ]


def outcome_of(message: Message) -> tuple[str, dict[str, Any] | None, Any]:
    """A response's (or `_abp/result`'s) outcome, its error data, its result data."""
    if "error" in message and message["error"] is not None:
        data = message["error"].get("data") or {}
        return outcome_of_error(data), data, None
    result = message.get("result") or {}
    return "succeeded", None, result.get("data")


def is_reuse_refusal(data: dict[str, Any] | None) -> bool:
    """The refusal of a callId the session already has."""
    details = (data or {}).get("details") or {}
    return bool(
        data and data.get("code") == "INVALID_PARAMS" and "callId" in str(details.get("path"))
    )


class RpcSession:
    """One JSON-RPC session over a series of sockets."""

    def __init__(self, url: str, key: str, ledger: Ledger) -> None:
        self.url = url
        self.key = key
        self.ledger = ledger
        self.ws: ClientConnection | None = None
        self.connection = 0
        self.session_id = ""
        self.token = ""
        self.failure: str | None = None
        self.held: set[str] = set()  # the last resume's heldCalls
        self.calls: dict[str, RpcCall] = {}
        self.by_request: dict[int, RpcCall] = {}
        self.cancel_requests: set[int] = set()  # `_abp/cancel` ids: their replies are no answers
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._live = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._dropped = False  # the last socket lost was the session's own drop

    async def open(self, *, resume: bool = False) -> None:
        """Connect and initialize (resuming the session if asked)."""
        ws = await connect(
            self.url, additional_headers={"Authorization": f"Bearer {self.key}"},
            proxy=None, ping_interval=None, open_timeout=30, close_timeout=2, max_size=None,
        )  # fmt: skip
        self.ws = ws
        self.connection += 1
        self._reader = asyncio.create_task(self._read(ws, self.connection))
        meta: dict[str, Any] = {"abp/notifications": False}
        if resume:
            meta["abp/resume"] = {
                "sessionId": self.session_id,
                "token": self.token,
                "awaiting": [tag for tag, call in self.calls.items() if not call.op.answers],
            }
            if not self._dropped:
                # Whoever waits for it runs once the frame below has gone out.
                self.ledger.reached(Moment.RESUME_SENT, f"{DOOR} session", session=self.session_id)
        answer = await self._request(
            "initialize",
            {"protocolVersion": 1, "clientInfo": {"name": "soak", "version": "1"}, "_meta": meta},
        )
        if "error" in answer:
            self._closing = True
            await ws.close()
            raise PermissionError(json.dumps(answer["error"])[:300])
        self.session_id = answer["result"]["_meta"]["abp/sessionId"]
        self.token = answer["result"]["_meta"]["abp/resumeToken"]
        self.held = set(answer["result"]["_meta"].get("abp/heldCalls", ()))
        self._live.set()

    async def _request(self, method: str, params: dict[str, Any]) -> Message:
        assert self.ws is not None
        request_id = next(self._ids)
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            await self.ws.send(
                json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            )
            return await asyncio.wait_for(reply, 60)
        finally:
            self._pending.pop(request_id, None)
            if reply.done() and not reply.cancelled():
                reply.exception()  # read: a failed send raised its own already

    async def _read(self, ws: ClientConnection, connection: int) -> None:
        with contextlib.suppress(ConnectionClosed, OSError):
            async for frame in ws:
                self._received(json.loads(frame), connection)
        if self._closing or connection != self.connection:
            return
        if not self._live.is_set():
            # Closed before its initialize was answered (a 1013 while PostgreSQL is
            # away): the open waiting for that answer fails now and tries again. Only
            # a live socket's loss starts a recovery: two at once would resume the
            # session against each other.
            for reply in self._pending.values():
                if not reply.done():
                    reply.set_exception(ConnectionError(f"socket {connection} closed"))
            self._pending.clear()
            return
        self._live.clear()
        self._keep(asyncio.create_task(self._recover()))

    def _received(self, message: Message, connection: int) -> None:
        method = message.get("method")
        if method == "_abp/result":
            params = message.get("params") or {}
            call = self.calls.get(str(params.get("callId")))
            if call is not None:
                self._answered(call, params, f"_abp/result on socket {connection}")
            return
        if method is not None:
            return  # progress is off; other notifications are not answers
        request_id = message.get("id")
        reply = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if reply is not None:
            reply.set_result(message)
            return
        if request_id in self.cancel_requests:
            return
        call = self.by_request.get(request_id) if isinstance(request_id, int) else None
        if call is None:
            self.ledger.count(DOOR, "responses to no request")
            return
        self._answered(call, message, f"response to {request_id} on socket {connection}")

    def _answered(self, call: RpcCall, message: Message, where: str) -> None:
        outcome, error, data = outcome_of(message)
        if is_reuse_refusal(error) and len(call.request_ids) > 1:
            self.ledger.note(call.op, "the call sent again was refused: the server had it")
            return
        ok = outcome != "succeeded" or names_call(call.op.tag, data)
        self.ledger.answer(call.op, outcome, {"error": error, "where": where}, data_ok=ok)

    async def _recover(self) -> None:
        for call in self.calls.values():
            if not call.op.answers:
                self.ledger.note(call.op, "socket lost")
        for attempt in range(60):
            try:
                await self.open(resume=True)
                break
            except PermissionError as refused:
                self._fail(f"resume refused: {refused}")
                return
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError):
                await asyncio.sleep(min(0.2 * (attempt + 1), 1.0))
        else:
            self._fail("could not resume")
            return
        self._dropped = False
        self.ledger.count(DOOR, "resumes")
        for call in to_send_again(list(self.calls.values()), self.held, self.connection):
            self.ledger.note(call.op, "sent again after a resume")
            call.body["_meta"] = {"abp/resent": True}
            await self._send_call(call)

    def _fail(self, why: str) -> None:
        self.failure = why
        self._live.set()
        for call in self.calls.values():
            if not call.op.answers:
                call.op.told = why
                self.ledger.note(call.op, f"told: {why}")

    async def _send(self, message: dict[str, Any]) -> int:
        """Send on the live socket; the connection it went on."""
        while True:
            await self._live.wait()
            if self.failure:
                raise ConnectionError(self.failure)
            ws = self.ws
            assert ws is not None
            try:
                await ws.send(json.dumps(message))
            except ConnectionClosed:
                await asyncio.sleep(0.05)
                continue
            return self.connection

    async def _send_call(self, call: RpcCall) -> None:
        request_id = next(self._ids)
        call.request_ids.append(request_id)
        self.by_request[request_id] = call
        message = {"jsonrpc": "2.0", "id": request_id, "method": "_abp/call", "params": call.body}
        call.sending = True
        try:
            call.connection = await self._send(message)
        finally:
            call.sending = False

    async def make_call(self, planned: plan.Planned, rng: random.Random) -> None:
        """Send one call (and schedule its cancel, by callId or by request id)."""
        op = self.ledger.new(DOOR, planned.capability, planned.cancel_plan, planned.timeout_ms)
        op.session = self.session_id
        body: dict[str, Any] = {
            "capability": planned.capability,
            "params": plan.params_for(op.tag, planned),
            "callId": op.tag,
        }
        if planned.timeout_ms is not None:
            body["timeout"] = planned.timeout_ms
        call = RpcCall(op, body)
        self.calls[op.tag] = call
        try:
            await self._send_call(call)
        except ConnectionError:
            op.told = self.failure
            raise
        if planned.cancel_after is not None:
            self.ledger.reached(Moment.CANCEL_DUE, op.tag, op=op, cancel_in=planned.cancel_after)
            by_request = rng.random() < 0.5
            self._keep(asyncio.create_task(self._cancel_at(call, planned.cancel_after, by_request)))

    async def _cancel_at(self, call: RpcCall, after: float, by_request: bool) -> None:
        await asyncio.sleep(after)
        if call.op.answers and call.op.cancel_plan != "race":
            return
        if by_request:
            message: dict[str, Any] = {
                "jsonrpc": "2.0", "method": "$/cancel_request",
                "params": {"requestId": call.request_ids[-1]},
            }  # fmt: skip
        else:
            request_id = next(self._ids)
            self.cancel_requests.add(request_id)
            message = {
                "jsonrpc": "2.0", "id": request_id, "method": "_abp/cancel",
                "params": {"callId": call.op.tag},
            }  # fmt: skip
        with contextlib.suppress(ConnectionError):
            await self._send(message)
            call.op.cancelled_at = self.ledger.now()
            kind = "$/cancel_request" if by_request else "_abp/cancel"
            self.ledger.note(call.op, f"cancel sent ({call.op.cancel_plan}, {kind})")
            self.ledger.count(DOOR, "cancels")

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drop(self) -> None:
        """Abort the socket: the session resumes on its own."""
        if self.ws is not None and self._live.is_set():
            self.ledger.count(DOOR, "drops")
            self._dropped = True
            self.ws.transport.abort()

    def settled_all(self) -> bool:
        """Every call answered, or the session gone."""
        return bool(self.failure) or (
            self._live.is_set() and all(c.op.answers for c in self.calls.values())
        )

    async def close(self) -> None:
        """Close the socket."""
        self._closing = True
        if self.ws is not None:
            await self.ws.close()


async def lane(session: RpcSession, ctx: Lane, *, pace: float, drop_every: float) -> None:
    """Calls at random intervals and a dropped socket now and then."""
    next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
    while not ctx.stop.is_set() and not session.failure:
        try:
            await session.make_call(plan.next_call(ctx.rng, ctx.mix), ctx.rng)
        except ConnectionError:
            break
        if time.monotonic() > next_drop:
            session.drop()
            next_drop = time.monotonic() + ctx.rng.expovariate(1 / drop_every)
        await ctx.pause(pace)
