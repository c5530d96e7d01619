"""200 `_abp/call`s over `/abp/rpc` with cancels of both kinds at random moments.

Over the real stack, on a few connections: short `test.sleep` calls (a few ms to
~100 ms), some cancelled with `$/cancel_request`, some with `_abp/cancel`, some with
both, at random times (seeded: the seed is printed, `ABP_JSONRPC_SEED` replays one).
Then every request is answered exactly once, a call never has both a result and a
-32800, and the job rows agree with what the client was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from capabilities.models import CancelSource, Job, JobStatus
from tests.support.jsonrpc_relay import auth_headers
from tests.support.rpc_agent import rpc_url
from tests.support.stack import Stack

pytestmark = pytest.mark.usefixtures("database")

CALLS = 200
CONNECTIONS = 3
LONG_STEPS = 6000  # of 10 ms: a minute; a few cancelled calls, so some cancels land running
Message = dict[str, Any]
NOT_FOUND = "Operation not found"


def id_key(request_id: Any) -> str:
    # 1, 1.0 and "1" are three ids.
    return f"{type(request_id).__name__}:{json.dumps(request_id)}"


@dataclass
class Call:
    """One `_abp/call` and the cancels sent for it."""

    line: int
    request_id: Any
    call_id: str
    echo: str
    token: str | None
    cancels: list[str]  # "request" ($/cancel_request), "abp" (_abp/cancel), in order
    cancel_request_id: str | None = None  # the id of its `_abp/cancel`, if any
    sent: list[str] = field(default_factory=list)  # the cancels actually sent


class Line:
    """One connection: what it sent, and everything it received, in order."""

    def __init__(self, number: int, ws: ClientConnection) -> None:
        self.number = number
        self.ws = ws
        self.received: list[Message] = []
        self.session_id = ""
        self.expected: set[str] = set()  # ids of the requests sent
        self.reader: asyncio.Task[None] | None = None
        self.all_sent = False
        self.all_answered = asyncio.Event()

    async def send(self, message: Message) -> None:
        if "id" in message:
            self.expected.add(id_key(message["id"]))
        await self.ws.send(json.dumps({"jsonrpc": "2.0", **message}))

    async def initialize(self) -> None:
        await self.send({"id": "init", "method": "initialize", "params": {"protocolVersion": 1}})
        reply = json.loads(await self.ws.recv())
        self.received.append(reply)
        assert "result" in reply, reply
        self.session_id = reply["result"]["_meta"]["abp/sessionId"]
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        try:
            async for frame in self.ws:
                self.received.append(json.loads(frame))
                self.note_progress()
        except ConnectionClosed:
            return

    def note_progress(self) -> None:
        if self.all_sent and self.expected <= self.answered():
            self.all_answered.set()

    def answered(self) -> set[str]:
        return {id_key(m["id"]) for m in self.received if "method" not in m and "id" in m}


async def run_calls(stack: Stack, rng: random.Random) -> tuple[list[Line], list[Call]]:
    """Send the calls and their cancels; wait until everything is answered."""
    lines = []
    for number in range(CONNECTIONS):
        ws = await connect(rpc_url(stack.ws_url), additional_headers=auth_headers())
        lines.append(Line(number, ws))
    try:
        for line in lines:
            await line.initialize()
        calls: list[Call] = []
        due: list[tuple[float, Call, str]] = []
        run = uuid.uuid4().hex[:6]
        for n in range(CALLS):
            line = rng.choice(lines)
            kinds = rng.choices(
                [[], ["request"], ["abp"], ["request", "abp"], ["abp", "request"]],
                weights=[45, 22, 22, 5, 6],
            )[0]
            long = bool(kinds) and rng.random() < 0.05
            steps, step_ms = (LONG_STEPS, 10) if long else (rng.randint(0, 5), rng.randint(1, 20))
            # Both kinds of id, each echoed as sent.
            request_id: Any = n if rng.random() < 0.5 else f"req-{n}"
            call = Call(
                line=line.number,
                request_id=request_id,
                call_id=f"prop-{run}-{n}",
                echo=f"echo-{n}",
                token=f"tok-{n}" if rng.random() < 0.3 else None,
                cancels=list(kinds),
            )
            params: Message = {
                "capability": "test.sleep",
                "params": {"steps": steps, "stepMs": step_ms, "echo": call.echo},
                "callId": call.call_id,
            }
            if call.token is not None:
                params["_meta"] = {"progressToken": call.token}
            await line.send({"id": request_id, "method": "_abp/call", "params": params})
            calls.append(call)
            at = time.monotonic()
            for kind in kinds:
                at += rng.uniform(0, 0.15)
                due.append((at, call, kind))
            await asyncio.sleep(rng.uniform(0, 0.004))
            await send_due(lines, due)
        while due:
            await send_due(lines, due)
            await asyncio.sleep(0.002)
        for line in lines:
            line.all_sent = True
            line.note_progress()
        # What is still unanswered after this is reported by the checks, not here.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(45):
                await asyncio.gather(*(line.all_answered.wait() for line in lines))
        await asyncio.sleep(0.5)  # anything answered twice would have arrived by now
        return lines, calls
    finally:
        for line in lines:
            await line.ws.close()
            if line.reader is not None:
                await line.reader


async def send_due(lines: list[Line], due: list[tuple[float, Call, str]]) -> None:
    now = time.monotonic()
    for item in sorted((item for item in due if item[0] <= now), key=lambda item: item[0]):
        due.remove(item)
        _, call, kind = item
        line = lines[call.line]
        if kind == "request":
            await line.send(
                {"method": "$/cancel_request", "params": {"requestId": call.request_id}}
            )
        else:
            call.cancel_request_id = f"cancel-{call.call_id}"
            await line.send(
                {
                    "id": call.cancel_request_id,
                    "method": "_abp/cancel",
                    "params": {"callId": call.call_id, "reason": "random"},
                }
            )
        call.sent.append(kind)


def test_random_calls_and_cancels_are_each_answered_once_and_agree_with_the_jobs(
    stack: Stack,
) -> None:
    seed = int(os.environ.get("ABP_JSONRPC_SEED", random.randrange(2**32)))
    print(f"ABP_JSONRPC_SEED={seed}")
    started = time.monotonic()
    lines, calls = asyncio.run(run_calls(stack, random.Random(seed)))
    assert time.monotonic() - started < 60, f"seed {seed}: too slow"
    problems = check(lines, calls)
    assert not problems, f"seed {seed}: " + "\n".join(problems[:40])


def check(lines: list[Line], calls: list[Call]) -> list[str]:
    """Every property the run must have; the violations found, as text."""
    problems: list[str] = []
    answers: dict[tuple[int, str], list[tuple[int, Message]]] = {}
    for line in lines:
        for position, message in enumerate(line.received):
            if "method" in message:
                problems += check_notification(line, message, calls)
                continue
            key = (line.number, id_key(message.get("id")))
            answers.setdefault(key, []).append((position, message))
            if key[1] not in line.expected:
                problems.append(f"line {line.number}: an answer to no request: {message}")
            if ("result" in message) == ("error" in message):
                problems.append(f"line {line.number}: not one of result or error: {message}")
    for line in lines:
        for expected in line.expected:
            count = len(answers.get((line.number, expected), []))
            if count != 1:
                problems.append(f"line {line.number}: request {expected} answered {count} times")

    sessions = {line.number: uuid.UUID(line.session_id) for line in lines}
    jobs = {
        (job.session_id, job.call_id): job
        for job in Job.objects.filter(session_id__in=sessions.values())
    }
    outcomes = {"result": 0, "cancelled": 0, "confirmed": 0}
    for call in calls:
        replies = answers.get((call.line, id_key(call.request_id)), [])
        job = jobs.get((sessions[call.line], call.call_id))
        if len(replies) != 1 or job is None:
            problems.append(f"{call.call_id}: replies {replies}, job {job}")
            continue
        position, reply = replies[0]
        confirmation = None
        if call.cancel_request_id is not None:
            confirmed = answers.get((call.line, id_key(call.cancel_request_id)), [])
            confirmation = confirmed[0] if len(confirmed) == 1 else None
        problems += check_call(
            call,
            position=position,
            reply=reply,
            job=job,
            confirmation=confirmation,
            outcomes=outcomes,
        )
    print(f"outcomes: {outcomes}")
    if not (outcomes["result"] and outcomes["cancelled"] and outcomes["confirmed"]):
        problems.append(f"the mix did not exercise every outcome: {outcomes}")
    return problems


def check_call(
    call: Call,
    *,
    position: int,
    reply: Message,
    job: Job,
    confirmation: tuple[int, Message] | None,
    outcomes: dict[str, int],
) -> list[str]:
    """One call's answer against its job row and its `_abp/cancel`'s confirmation."""
    problems = []
    where = f"{call.call_id} (id {call.request_id!r}, cancels {call.sent})"
    if call.cancel_request_id is not None and confirmation is None:
        return [f"{where}: its _abp/cancel was not answered once"]
    cancelled_by_confirmation = False
    if confirmation is not None:
        confirmed_at, confirmed = confirmation
        result = confirmed.get("result")
        if not isinstance(result, dict) or result.get("callId") != call.call_id:
            return [f"{where}: _abp/cancel answered {confirmed}"]
        cancelled_by_confirmation = result.get("cancelled") is True
        if cancelled_by_confirmation:
            outcomes["confirmed"] += 1
            # The cancel that settled the call is confirmed before the call's -32800; a
            # $/cancel_request sent earlier may have settled it first (then the
            # confirmation says cancelled: true, as for any call already cancelled).
            if confirmed_at > position and call.sent[0] == "abp":
                problems.append(f"{where}: the call was answered before its cancel's confirmation")
        elif result.get("reason") == NOT_FOUND:
            # The call was sent first on the same connection: the session knows it.
            problems.append(f"{where}: a cancel of a call sent before it was not found")
    if "result" in reply:
        outcomes["result"] += 1
        data = reply["result"]
        if data.get("callId") != call.call_id or data.get("data", {}).get("echo") != call.echo:
            problems.append(f"{where}: result {data}")
        if cancelled_by_confirmation:
            problems.append(f"{where}: confirmed cancelled, then a result {reply}")
        if job.status != JobStatus.SUCCEEDED:
            problems.append(f"{where}: a result, but the job is {job.status}")
        return problems
    error = reply.get("error") or {}
    code, data = error.get("code"), error.get("data") or {}
    if code != -32800 or data.get("code") != "CANCELLED":
        return [*problems, f"{where}: error {error}"]
    outcomes["cancelled"] += 1
    if not call.sent:
        problems.append(f"{where}: -32800 without any cancel")
    if call.sent == ["abp"] and not cancelled_by_confirmation:
        problems.append(f"{where}: -32800, but its only cancel said cancelled false")
    if job.status != JobStatus.CANCELLED or job.cancel_source != CancelSource.AGENT:
        problems.append(f"{where}: -32800, but the job is {job.status} ({job.cancel_source})")
    if job.is_active:
        problems.append(f"{where}: the job is still {job.status}")
    return problems


def check_notification(line: Line, message: Message, calls: list[Call]) -> list[str]:
    """Only progress, for a call of this line that asked for it with its token."""
    if message.get("method") != "_abp/progress":
        return [f"line {line.number}: an unexpected notification {message}"]
    params = message.get("params") or {}
    tokens: dict[Any, Call] = {c.token: c for c in calls if c.line == line.number and c.token}
    call = tokens.get(params.get("progressToken"))
    if call is None or params.get("callId") != call.call_id:
        return [f"line {line.number}: progress for no call of its own: {message}"]
    return []
