"""Many ABP agents over asyncio WebSockets, spread over several Daphnes.

Each session is one agent: it initializes on its home Daphne, sends calls (mostly
`convert.markdownToHtml`, some long `test.sleep`) and random cancels, and when its socket
dies it resumes the session (`initialize.resume`) on a Daphne that is still up. Every
frame is kept with the connection it came on, so that every call's answers can be
counted across the session's connections.

After a resume the agent does what a careful one must: calls and cancels it sent on the
lost socket without hearing back are sent again, with the same callId. A callId runs
once per session, so a call the server already had is refused (`INVALID_PARAMS` on
`payload.options.callId`) and still answered once by its own result, while one whose
frame died unread with its Daphne runs now. A cancel sent twice is answered the same way
both times.

`run_scenario` is the multi-node scenario of tests/stack/test_multi_node.py and
bench/multi_node.py: sessions opened and left idle (memory per session), then the load,
one Daphne killed by PID, one worker node's main process killed by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psutil  # type: ignore[import-untyped]
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.support.agent import envelope
from tests.support.topology import Topology

Envelope = dict[str, Any]
# (arrival time, index of the connection it came on, the envelope)
Received = tuple[float, int, Envelope]

INITIALIZE = {
    "agent": {"name": "fleet", "version": "1.0"},
    "protocolVersion": "0.1",
    "features": {"notifications": False, "progress": False},
}
# Production settings with the test capability (test.sleep) and quick failure detection:
# a dead worker's jobs fail after 3 s without a heartbeat, its lost task messages are
# handed over again after 5 s. Sessions may be resumed for 120 s (the product's 60 s,
# doubled): one Daphne takes 500 resumes at once while it also takes the calls, and each
# Daphne runs its database work on one thread; on a loaded 2-core box the last resume
# came 35 s after the kill.
SETTINGS = {
    "DJANGO_SETTINGS_MODULE": "tests.settings",
    "DJANGO_ENV": "production",
    "DJANGO_SECRET_KEY": "multi-node-secret-" + "q7w8e9r0" * 6,
    "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "ABP_ALLOWED_ORIGINS": "http://127.0.0.1:*",
    "DJANGO_LOG_LEVEL": "INFO",
    "ABP_MAX_CONCURRENT_CALLS": "1000",
    "ABP_CALLS_PER_MINUTE": "10000000",
    "ABP_MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": "1000000",
    "ABP_MAX_OPEN_SESSIONS_PER_PRINCIPAL": "1000000",
    "ABP_REAPER_INTERVAL_SECONDS": "0.5",
    "ABP_WORKER_LOST_AFTER_SECONDS": "3",
    "ABP_LOCAL_LANE_TIME_LIMIT_SECONDS": "1.5",  # under the above (a system check)
    "ABP_HARD_KILL_GRACE_SECONDS": "1.5",
    "ABP_WORKER_ANNOUNCE_SECONDS": "0.5",
    "ABP_WORKER_TTL_SECONDS": "2",
    "ABP_AVAILABILITY_POLL_SECONDS": "0.25",
    "ABP_REDISPATCH_AFTER_SECONDS": "5",
    "ABP_RESUME_GRACE_SECONDS": "120",
    "ABP_WORKER_MEMORY_LIMIT_MB": "1024",
}

# Handshakes in progress at once (Daphne's listen backlog is 50).
CONNECT_GATE = 50
CALL_ID_PATH = "payload.options.callId"


def is_reuse_refusal(answer: Envelope) -> bool:
    """A call-result refusing a callId the session already has, to a call sent again.

    Only a frame sent again (its envelope id has a `~`) may be refused so: the same
    refusal of a first send counts as that call's (wrong) result.
    """
    error = answer["payload"].get("error") or {}
    return bool(
        "~" in str(answer.get("id"))
        and error.get("code") == "INVALID_PARAMS"
        and (error.get("details") or {}).get("path") == CALL_ID_PATH
    )


@dataclass
class Sent:
    """One frame sent: its envelope id, when, and on which connection of its session."""

    message_id: str
    at: float
    connection: int


@dataclass
class Call:
    """One call of a session, with everything sent for it and every answer."""

    session: int
    call_id: str
    capability: str
    params: dict[str, Any]
    cancel_after: float | None
    sends: list[Sent] = field(default_factory=list)
    cancels: list[Sent] = field(default_factory=list)
    answers: list[Received] = field(default_factory=list)
    cancel_answers: list[Received] = field(default_factory=list)

    @property
    def results(self) -> list[Received]:
        """Its call-results, less the refusals of it being sent again."""
        return [a for a in self.answers if not is_reuse_refusal(a[2])]

    @property
    def refusals(self) -> list[Received]:
        """Refusals of it being sent again (the server had it already)."""
        return [a for a in self.answers if is_reuse_refusal(a[2])]

    @property
    def first_sent(self) -> float:
        """When it was first sent."""
        return self.sends[0].at


@dataclass
class Connection:
    """One WebSocket of a session."""

    index: int
    url: str
    ws: ClientConnection
    lost: bool = False  # ended without us closing it
    closing: bool = False
    reader: asyncio.Task[None] | None = None


class SessionRefused(Exception):
    """initialize or its resume was answered with an error."""


class SessionGone(Exception):
    """The session could not be resumed: nothing more can be sent on it."""


@dataclass
class Planned:
    """A call a session will make: when (s after the start), what, and its cancel."""

    at: float
    capability: str
    params: dict[str, Any]
    cancel_after: float | None


class AgentSession:
    """One agent: its session over a series of connections."""

    initialize_payload: dict[str, Any] = INITIALIZE  # `resume` is added to it

    def __init__(self, fleet: Fleet, index: int, url: str) -> None:
        self.fleet = fleet
        self.index = index
        self.home_url = url
        self.connections: list[Connection] = []
        self.current: Connection | None = None
        self.live = asyncio.Event()
        self.session_id = ""
        self.token = ""
        self.calls: dict[str, Call] = {}
        self.strays: list[Envelope] = []  # frames of no known call
        self.failure: str | None = None
        self.resumes: list[float] = []  # how long each resume took (s)
        self._replies: dict[str, asyncio.Future[Envelope]] = {}
        self._ids = itertools.count(1)
        self._numbers = itertools.count()
        self._recovering: asyncio.Task[None] | None = None
        self.initialized: dict[str, Any] = {}  # the last initialize-result's payload

    # -- connections ------------------------------------------------------------------

    async def open(self) -> float:
        """Connect and initialize on the home Daphne; seconds it took."""
        started = time.perf_counter()
        await self._attach(self.home_url, resume=False)
        return time.perf_counter() - started

    async def _attach(self, url: str, *, resume: bool) -> None:
        message_id = f"init-{next(self._ids)}"
        payload: dict[str, Any] = dict(self.initialize_payload)
        if resume:
            payload["resume"] = self._resume_payload()
        async with self.fleet.gate:
            ws = await connect(
                url,
                max_size=None,
                additional_headers={"Authorization": f"Bearer {self.fleet.key}"},
                proxy=None,
                ping_interval=None,
                open_timeout=60,
                close_timeout=2,
            )
            conn = Connection(len(self.connections), url, ws)
            self.connections.append(conn)
            reply: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
            self._replies[message_id] = reply
            conn.reader = asyncio.create_task(self._read(conn))
            try:
                await ws.send(envelope("initialize", message_id, payload))
                answer = await asyncio.wait_for(reply, 60)
            finally:
                self._replies.pop(message_id, None)
                if reply.done() and not reply.cancelled():
                    reply.exception()  # read: a failed send raised its own already
        if "error" in answer["payload"]:
            conn.closing = True
            await ws.close()
            raise SessionRefused(str(answer["payload"]["error"]))
        self.session_id = answer["payload"]["sessionId"]
        self.token = answer["payload"]["resumeToken"]
        self.initialized = answer["payload"]
        self.current = conn
        self.live.set()

    async def _read(self, conn: Connection) -> None:
        try:
            async for frame in conn.ws:
                now = time.perf_counter()
                self.fleet.last_frame = now
                message: Envelope = json.loads(frame)
                self._route(now, conn, message)
        except (ConnectionClosed, OSError):
            pass
        if conn.closing:
            return
        conn.lost = True
        if self.current is conn:
            self.live.clear()
            self.current = None
            self._recovering = asyncio.create_task(self._recover())
            return
        # Closed before its initialize was answered (a 1013 while the database is
        # away): the attach waiting for that answer tries again now, not in 60 s.
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(ConnectionError(f"connection {conn.index} closed"))

    def _route(self, now: float, conn: Connection, message: Envelope) -> None:
        kind = message.get("type")
        payload = message.get("payload") or {}
        if kind == "initialize-result":
            reply = self._replies.pop(message.get("id", ""), None)
            if reply is not None and not reply.done():
                reply.set_result(message)
                return
        call = self.calls.get(payload.get("callId", ""))
        if call is not None and kind == "capabilities/call-result":
            call.answers.append((now, conn.index, message))
            return
        if call is not None and kind == "capabilities/cancel-result":
            call.cancel_answers.append((now, conn.index, message))
            return
        self.strays.append(message)

    async def _recover(self) -> None:
        """Resume on a Daphne still up, then send again what the lost socket left unanswered."""
        started = time.perf_counter()
        for attempt in range(40):
            url = self.fleet.alive_url(self.index + attempt)
            try:
                await self._attach(url, resume=True)
                break
            except SessionRefused as refused:
                self.failure = f"resume refused: {refused}"
                self.live.set()  # wakes the senders, who give up
                return
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError):
                await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))
        else:
            self.failure = "could not resume on any Daphne"
            self.live.set()
            return
        self.resumes.append(time.perf_counter() - started)
        # Live again since _attach returned: nothing else ran in between.
        lost = {c.index for c in self.connections if c.lost}
        calls_again = self._calls_to_send_again(lost)
        cancels_again = [
            call
            for call in self.calls.values()
            if call.cancels
            and call.cancels[-1].connection in lost
            and not any(a[2]["id"] == call.cancels[-1].message_id for a in call.cancel_answers)
        ]
        with contextlib.suppress(SessionGone):
            for call in calls_again:
                await self._send_call(call)
            for call in cancels_again:
                await self._send_cancel(call)

    def _resume_payload(self) -> dict[str, Any]:
        """`initialize.payload.resume` for this session."""
        return {"sessionId": self.session_id, "token": self.token}

    def _calls_to_send_again(self, lost: set[int]) -> list[Call]:
        """After a resume: the calls last sent on a lost socket and never answered."""
        return [
            call
            for call in self.calls.values()
            if not call.answers and call.sends and call.sends[-1].connection in lost
        ]

    # -- frames -----------------------------------------------------------------------

    async def _send(self, message_type: str, message_id: str, payload: dict[str, Any]) -> Sent:
        frame = envelope(message_type, message_id, payload)
        while True:
            await self.live.wait()
            if self.failure:
                raise SessionGone(self.failure)
            conn = self.current
            if conn is None:
                await asyncio.sleep(0.01)
                continue
            try:
                await conn.ws.send(frame)
            except ConnectionClosed:
                await asyncio.sleep(0.01)  # its reader notices and resumes
                continue
            return Sent(message_id, time.perf_counter(), conn.index)

    async def _send_call(self, call: Call) -> None:
        message_id = call.call_id if not call.sends else f"{call.call_id}~{len(call.sends)}"
        payload = self._call_payload(call)
        call.sends.append(await self._send("capabilities/call", message_id, payload))

    def _call_payload(self, call: Call) -> dict[str, Any]:
        """A call's payload, as sent (the first time and again)."""
        return {
            "capability": call.capability,
            "params": call.params,
            "options": {"callId": call.call_id},
        }

    async def _send_cancel(self, call: Call) -> None:
        message_id = f"{call.call_id}-cancel{len(call.cancels)}"
        call.cancels.append(
            await self._send("capabilities/cancel", message_id, {"callId": call.call_id})
        )

    async def drive(self, plan: list[Planned], start: float) -> None:
        """Make the planned calls at their moments (cancels after theirs)."""
        cancels = []
        for planned in plan:
            delay = start + planned.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.failure:
                break
            call_id = f"s{self.index}-c{next(self._numbers)}"
            # Each call's answer names it: a result crossed with another call's shows.
            params = {**planned.params}
            if planned.capability == "convert.markdownToHtml":
                params["markdown"] = f"# Call {call_id}\n\n{params['markdown']}"
            else:
                params["echo"] = call_id
            call = Call(self.index, call_id, planned.capability, params, planned.cancel_after)
            self.calls[call.call_id] = call
            try:
                await self._send_call(call)
            except SessionGone:
                break
            if planned.cancel_after is not None:
                cancels.append(asyncio.create_task(self._cancel_later(call)))
        await asyncio.gather(*cancels)

    async def _cancel_later(self, call: Call) -> None:
        assert call.cancel_after is not None
        await asyncio.sleep(call.cancel_after)
        if not call.results:
            with contextlib.suppress(SessionGone):
                await self._send_cancel(call)

    def settled(self) -> bool:
        """Whether everything it sent has had its answer (or it gave up)."""
        if self.failure:
            return True
        if not self.live.is_set():
            return False
        for call in self.calls.values():
            if not call.results:
                return False
            replied = {a[2]["id"] for a in call.cancel_answers}
            lost = {c.index for c in self.connections if c.lost}
            for cancel in call.cancels:
                if cancel.message_id not in replied and cancel.connection not in lost:
                    return False
        return True

    async def close(self) -> None:
        """Close every connection still open."""
        if self._recovering is not None:
            self._recovering.cancel()
        for conn in self.connections:
            conn.closing = True
        await asyncio.gather(
            *(c.ws.close() for c in self.connections if not c.lost), return_exceptions=True
        )
        await asyncio.gather(
            *(c.reader for c in self.connections if c.reader is not None), return_exceptions=True
        )


class Fleet:
    """The sessions, the Daphnes they may use, and the agent key they share."""

    def __init__(self, urls: list[str], key: str) -> None:
        self.urls = urls
        self.dead: set[str] = set()
        self.key = key
        self.gate = asyncio.Semaphore(CONNECT_GATE)
        self.sessions: list[AgentSession] = []
        self.last_frame = time.perf_counter()

    def calls_to_cancel(self) -> set[str]:
        """The calls sent so far that their session will cancel."""
        return {
            call.call_id
            for session in self.sessions
            for call in session.calls.values()
            if call.cancel_after is not None
        }

    def alive_url(self, n: int) -> str:
        """The n-th (round robin) Daphne still up."""
        alive = [url for url in self.urls if url not in self.dead]
        return alive[n % len(alive)]

    async def open(self, count: int) -> list[float]:
        """Open `count` sessions, spread round robin over the Daphnes; their open times."""
        self.sessions = [
            AgentSession(self, index, self.urls[index % len(self.urls)]) for index in range(count)
        ]
        return list(await asyncio.gather(*(s.open() for s in self.sessions)))

    def calls(self) -> list[Call]:
        """Every call of every session."""
        return [call for s in self.sessions for call in s.calls.values()]

    async def close(self) -> None:
        """Close every session's connections."""
        await asyncio.gather(*(s.close() for s in self.sessions))


# -- the scenario -----------------------------------------------------------------------


@dataclass
class Options:
    """The multi-node scenario's sizes and moments (seconds from the first call)."""

    sessions: int = 1000
    calls: int = 400  # over all sessions, each to a session drawn at random
    window: float = 10.0  # calls are sent at random moments within it
    long_share: float = 0.06  # test.sleep calls among all
    long_seconds: tuple[float, float] = (2.0, 4.0)
    cancel_long: float = 0.4  # share of long calls cancelled
    cancel_small: float = 0.05  # share of markdown calls cancelled
    cancel_window: float = 2.0  # a cancel goes 0..this after its call
    burst: int = 0  # markdown calls sent at once before the failures (capacity)
    kill_web_at: float = 3.0
    kill_worker_at: float = 4.5  # then as soon as a job runs on the node
    idle_seconds: float = 5.0
    stall_timeout: float = 60.0
    linger: float = 3.0
    seed: int = 1
    victim_web: int = 1  # index into topology.webs
    victim_worker: str = "heavy@node2"


@dataclass
class Memory:
    """One Daphne's memory (KiB) before the sessions and with them idle."""

    name: str
    sessions: int
    rss_before: int
    pss_before: int
    rss_idle: int
    pss_idle: int

    @property
    def rss_per_session(self) -> float:
        """KiB of RSS per idle session."""
        return (self.rss_idle - self.rss_before) / max(self.sessions, 1)

    @property
    def pss_per_session(self) -> float:
        """KiB of PSS per idle session."""
        return (self.pss_idle - self.pss_before) / max(self.sessions, 1)


@dataclass
class Outcome:
    """What one run did and found."""

    options: Options
    fleet: Fleet
    memory: list[Memory]
    open_seconds: float = 0.0
    first_call: float = 0.0
    web_killed_at: float = 0.0
    worker_killed_at: float = 0.0
    running_on_victim: list[str] = field(default_factory=list)  # job ids at the kill
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    waited_out: bool = False
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    figures: dict[str, Any] = field(default_factory=dict)


def memory_kib(pid: int) -> tuple[int, int]:
    """A process's RSS and PSS, in KiB."""
    info = psutil.Process(pid).memory_full_info()
    return int(info.rss) // 1024, int(getattr(info, "pss", info.rss)) // 1024


def plan_calls(rng: random.Random, options: Options) -> list[list[Planned]]:
    """Each session's calls (the calls spread over the sessions at random)."""
    plans: list[list[Planned]] = [[] for _ in range(options.sessions)]
    for _ in range(options.calls):
        plan = plans[rng.randrange(options.sessions)]
        at = rng.uniform(0, options.window)
        cancel_after = rng.uniform(0, options.cancel_window)
        if rng.random() < options.long_share:
            seconds = rng.uniform(*options.long_seconds)
            params: dict[str, Any] = {"steps": round(seconds * 20), "stepMs": 50}
            cancelled = rng.random() < options.cancel_long
            plan.append(Planned(at, "test.sleep", params, cancel_after if cancelled else None))
        else:
            params = {"markdown": "Some *emphasis* and a [link](https://example.com)."}
            cancelled = rng.random() < options.cancel_small
            plan.append(
                Planned(at, "convert.markdownToHtml", params, cancel_after if cancelled else None)
            )
    return [sorted(plan, key=lambda p: p.at) for plan in plans]


def running_on(topology: Topology, worker: str, *, not_calls: set[str] | None = None) -> list[str]:
    """Ids of the jobs running on a worker node right now, but those of `not_calls`."""
    rows = topology.database.query(
        "SELECT id, call_id FROM capabilities_job WHERE status = 'running' AND worker LIKE %s",
        (f"{worker}:%",),
    )
    return [str(job_id) for job_id, call_id in rows if call_id not in (not_calls or set())]


async def warm_up(fleet: Fleet) -> None:
    """One markdown call through each Daphne (imports, connections) before measuring."""
    for url in fleet.urls:
        session = AgentSession(fleet, -1, url)
        await session.open()
        plan = [Planned(0.0, "convert.markdownToHtml", {"markdown": "warm"}, None)]
        await asyncio.wait_for(session.drive(plan, time.perf_counter()), 60)
        for _ in range(1200):  # a minute at most
            if session.settled():
                break
            await asyncio.sleep(0.05)
        await session.close()


async def run_scenario(topology: Topology, key: str, options: Options) -> Outcome:
    """Open the sessions, measure them idle, then the load with both kills; check it all."""
    rng = random.Random(options.seed)
    urls = [web.ws_url for web in topology.webs]
    fleet = Fleet(urls, key)
    outcome = await open_idle(topology, fleet, options)

    if options.burst:
        await burst(fleet, rng, options, outcome)
    plans = plan_calls(rng, options)
    outcome.first_call = start = time.perf_counter() + 0.2
    drivers = [
        asyncio.create_task(s.drive(plan, start))
        for s, plan in zip(fleet.sessions, plans, strict=True)
    ]
    victim = topology.webs[options.victim_web]
    await asyncio.sleep(max(0.0, start + options.kill_web_at - time.perf_counter()))
    fleet.dead.add(victim.ws_url)
    victim.process.kill()  # SIGKILL by PID: no disconnect handler runs
    outcome.web_killed_at = time.perf_counter()

    await asyncio.sleep(max(0.0, start + options.kill_worker_at - time.perf_counter()))
    await kill_worker_node(topology, fleet, options, outcome)

    try:
        await asyncio.wait_for(asyncio.gather(*drivers), options.window + options.stall_timeout)
    except TimeoutError:
        outcome.problems.append("calls still unsent at the end of the window")
    fleet.last_frame = time.perf_counter()
    while not all(s.settled() for s in fleet.sessions):
        if time.perf_counter() - fleet.last_frame > options.stall_timeout:
            outcome.waited_out = True
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(options.linger)  # anything arriving now is a duplicate
    await fleet.close()
    outcome.jobs = await asyncio.to_thread(jobs_of, topology, fleet)
    check(outcome)
    return outcome


async def open_idle(topology: Topology, fleet: Fleet, options: Options) -> Outcome:
    """Open the sessions and leave them idle: each Daphne's memory before and after."""
    await warm_up(fleet)
    await asyncio.sleep(1.0)
    before = {web.process.name: memory_kib(web.process.pid) for web in topology.webs}
    started = time.perf_counter()
    await fleet.open(options.sessions)
    open_seconds = time.perf_counter() - started
    await asyncio.sleep(2.0 + options.idle_seconds)  # settled after the handshakes, then idle
    memory = []
    for web in topology.webs:
        rss, pss = memory_kib(web.process.pid)
        count = sum(1 for s in fleet.sessions if s.home_url == web.ws_url)
        name = web.process.name
        memory.append(Memory(name, count, before[name][0], before[name][1], rss, pss))
    return Outcome(options, fleet, memory, open_seconds=open_seconds)


async def kill_worker_node(
    topology: Topology, fleet: Fleet, options: Options, outcome: Outcome
) -> None:
    """SIGKILL the victim node's main process (by PID) once a job runs on it.

    One its agent will not cancel: a job cancelled before the reaper finds it lost is
    answered cancelled, and the kill must be answered WORKER_LOST at least once.
    """
    node = topology.workers[options.victim_worker]
    deadline = time.perf_counter() + 15
    while not await asyncio.to_thread(
        running_on, topology, options.victim_worker, not_calls=fleet.calls_to_cancel()
    ):
        if time.perf_counter() > deadline:
            outcome.problems.append(f"no job ran on {options.victim_worker} to kill it under")
            break
        await asyncio.sleep(0.05)
    os.kill(node.pid, signal.SIGKILL)  # its pool's children get SIGKILL too (pdeathsig)
    outcome.worker_killed_at = time.perf_counter()
    outcome.running_on_victim = await asyncio.to_thread(running_on, topology, options.victim_worker)


async def burst(fleet: Fleet, rng: random.Random, options: Options, outcome: Outcome) -> None:
    """`options.burst` markdown calls at once, on sessions drawn at random: answers/s."""
    plans: list[list[Planned]] = [[] for _ in fleet.sessions]
    params = {"markdown": "A *burst*."}
    for _ in range(options.burst):
        planned = Planned(0.0, "convert.markdownToHtml", params, None)
        plans[rng.randrange(len(plans))].append(planned)
    before = {id(call) for call in fleet.calls()}
    start = time.perf_counter()
    await asyncio.gather(*(s.drive(p, start) for s, p in zip(fleet.sessions, plans, strict=True)))
    sent = time.perf_counter()
    fleet.last_frame = sent
    while not all(s.settled() for s in fleet.sessions):
        if time.perf_counter() - fleet.last_frame > options.stall_timeout:
            outcome.problems.append("the burst was not answered")
            break
        await asyncio.sleep(0.05)
    calls = [c for c in fleet.calls() if id(c) not in before and c.results]
    done = [c for c in calls if c.results[0][2]["payload"].get("success") is True]
    last = max((c.results[0][0] for c in calls), default=sent)
    last_done = max((c.results[0][0] for c in done), default=sent)
    outcome.figures["burst"] = {
        "calls": options.burst,
        "answered": len(calls),
        "succeeded": len(done),  # the others timed out, queued past their 30 s
        "seconds_to_send": round(sent - start, 2),
        "seconds_to_last_answer": round(last - start, 2),
        "answers_per_second": round(len(calls) / max(last - start, 1e-9), 1),
        "results_per_second": round(len(done) / max(last_done - start, 1e-9), 1),
    }


def jobs_of(topology: Topology, fleet: Fleet) -> dict[tuple[str, str], dict[str, Any]]:
    """The job rows of the fleet's sessions, by (session id, callId)."""
    ids = [s.session_id for s in fleet.sessions if s.session_id]
    rows = topology.database.query(
        "SELECT session_id::text, call_id, id::text, status, error_code, worker, cancel_source"
        " FROM capabilities_job WHERE session_id::text = ANY(%s)",
        (ids,),
    )
    names = ("session_id", "call_id", "id", "status", "error_code", "worker", "cancel_source")
    return {(row[0], row[1]): dict(zip(names, row, strict=True)) for row in rows}


# -- the checks -------------------------------------------------------------------------


def check(outcome: Outcome) -> None:
    """Fill in the outcome's problems, counts and figures."""
    options, fleet, counts = outcome.options, outcome.fleet, outcome.counts
    problems = outcome.problems
    if outcome.waited_out:
        problems.append(f"gave up waiting: no frame for {options.stall_timeout:g} s")
    victim_node = options.victim_worker
    doomed = set(outcome.running_on_victim)
    for session in fleet.sessions:
        moved = session.home_url == fleet.urls[options.victim_web]
        if moved and not session.resumes:
            problems.append(f"session {session.index}: its Daphne died and it did not resume")
        if not moved and session.resumes:
            problems.append(f"session {session.index}: resumed though its Daphne lived")
        counts["sessions resumed elsewhere"] += bool(session.resumes)
        if session.failure:
            problems.append(f"session {session.index}: {session.failure}")
        for stray in session.strays:
            problems.append(f"session {session.index}: unexpected {stray.get('type')}: {stray}")
        for call in session.calls.values():
            counts["calls"] += 1
            counts[f"calls {call.capability}"] += 1
            job = outcome.jobs.get((session.session_id, call.call_id))
            problems.extend(check_call(session, call, job, outcome))
            label = f"{call.call_id} ({call.capability})"
            if job is None:
                continue
            error = job["error_code"]
            if error == "WORKER_LOST":
                counts["WORKER_LOST"] += 1
                if not str(job["worker"]).startswith(f"{victim_node}:"):
                    problems.append(f"{label}: WORKER_LOST on {job['worker']}")
            if job["id"] in doomed and error != "WORKER_LOST" and job["cancel_source"] != "agent":
                problems.append(f"{label}: running on {victim_node} at its death, got {job}")
            if call.first_sent > outcome.worker_killed_at and str(job["worker"]).startswith(
                f"{victim_node}:"
            ):
                problems.append(f"{label}: sent after the kill, ran on {job['worker']}")
    if not doomed:
        problems.append(f"no job was running on {victim_node} when it was killed")
    if counts["WORKER_LOST"] == 0:
        problems.append("no call was answered WORKER_LOST")
    outcome.figures.update(figures(outcome))


def check_call(
    session: AgentSession, call: Call, job: dict[str, Any] | None, outcome: Outcome
) -> list[str]:
    """What is wrong with one call's answers (nothing, if all went right)."""
    counts = outcome.counts
    problems = []
    results = call.results
    label = f"{call.call_id} ({call.capability})"
    if len(results) != 1:
        return [f"{label}: {len(results)} call-results; job {job}"]
    counts["answered once"] += 1
    _, _, answer = results[0]
    payload = answer["payload"]
    if job is None:
        return [f"{label}: answered {payload} but no job was stored"]
    if answer["id"] != call.call_id:
        counts["run from the frame sent again"] += 1  # the first died unread with its Daphne
    counts["answered after a resume" if results[0][1] else "answered on the first socket"] += 1
    if len(call.sends) > 1:
        counts["calls sent again after a resume"] += 1
        if len(call.refusals) != len(call.sends) - 1 - (answer["id"] != call.call_id):
            problems.append(f"{label}: sent {len(call.sends)} times, refusals {call.refusals}")
    elif call.refusals:
        problems.append(f"{label}: refused {call.refusals} though sent once")
    cancelled = bool(payload.get("cancelled"))
    error = (payload.get("error") or {}).get("code")
    if cancelled and error == "TIMEOUT":
        counts["timed out (queued past the capability's timeout)"] += 1
    elif cancelled:
        counts["cancelled"] += 1
        if error != "CANCELLED" or not call.cancels:
            problems.append(f"{label}: cancelled without a cancel: {payload}")
    elif error == "WORKER_LOST":
        if call.capability != "test.sleep":
            problems.append(f"{label}: WORKER_LOST for a small call")
    elif payload.get("success") is not True:
        problems.append(f"{label}: failed: {payload.get('error')}")
    else:
        counts["succeeded"] += 1
        data = payload.get("data") or {}
        right = (
            f"<h1>Call {call.call_id}</h1>" in data.get("html", "")
            if call.capability == "convert.markdownToHtml"
            else data.get("echo") == call.call_id
        )
        if not right:
            problems.append(f"{label}: another call's result? {data}")
    status = {"cancelled": "cancelled", "failed": "failed", "succeeded": "succeeded"}
    expected = "cancelled" if cancelled else "succeeded" if payload.get("success") else "failed"
    if status.get(job["status"]) != expected:
        problems.append(f"{label}: answered {expected} but the job is {job['status']}")
    lost = {c.index for c in session.connections if c.lost}
    answered_ids = Counter(a[2]["id"] for a in call.cancel_answers)
    for cancel in call.cancels:
        counts["cancels sent"] += 1
        got = answered_ids[cancel.message_id]
        if got > 1 or (got == 0 and cancel.connection not in lost):
            problems.append(f"{label}: cancel {cancel.message_id} answered {got} times")
    for _, _, reply in call.cancel_answers:
        if bool(reply["payload"].get("cancelled")) != cancelled:
            problems.append(f"{label}: cancel-result {reply['payload']} but call-result {payload}")
    return problems


def figures(outcome: Outcome) -> dict[str, Any]:
    """Memory per idle session and answer rates (of the scenario, after any burst)."""
    calls = [c for c in outcome.fleet.calls() if c.sends and c.first_sent >= outcome.first_call]
    answered = [c for c in calls if len(c.results) == 1]
    last = max((c.results[0][0] for c in answered), default=outcome.first_call)
    span = max(last - outcome.first_call, 1e-9)
    small = [c for c in answered if c.capability == "convert.markdownToHtml"]
    small_latency = sorted(
        (c.results[0][0] - c.first_sent) * 1000
        for c in small
        if len(c.sends) == 1 and not c.cancels
    )

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    resumes = sorted(r for s in outcome.fleet.sessions for r in s.resumes)
    return {
        **({"burst": outcome.figures["burst"]} if "burst" in outcome.figures else {}),
        "sessions": len(outcome.fleet.sessions),
        "open_seconds": round(outcome.open_seconds, 2),
        "memory": [
            {
                "daphne": m.name,
                "sessions": m.sessions,
                "rss_before_mib": round(m.rss_before / 1024, 1),
                "rss_idle_mib": round(m.rss_idle / 1024, 1),
                "rss_kib_per_session": round(m.rss_per_session, 1),
                "pss_kib_per_session": round(m.pss_per_session, 1),
            }
            for m in outcome.memory
        ],
        "calls": len(calls),
        "answered": len(answered),
        "seconds_first_call_to_last_answer": round(span, 2),
        "answers_per_second": round(len(answered) / span, 1),
        "small_answers_per_second": round(len(small) / span, 1),
        "small_call_to_result_ms_p50": round(pct(small_latency, 0.5), 1),
        "small_call_to_result_ms_p95": round(pct(small_latency, 0.95), 1),
        "sessions_resumed": len(resumes),
        "resume_seconds_p50": round(pct(resumes, 0.5), 3),
        "resume_seconds_max": round(resumes[-1], 3) if resumes else None,
        "running_on_killed_worker": len(outcome.running_on_victim),
        "counts": dict(outcome.counts),
    }


def report_lines(outcome: Outcome) -> list[str]:
    """The figures as text."""
    f = outcome.figures
    lines = [f"== {f['sessions']} sessions over {len(outcome.memory)} Daphnes"]
    lines.append(f"   open + initialize all: {f['open_seconds']} s")
    for m in f["memory"]:
        lines.append(
            f"   {m['daphne']}: {m['sessions']} idle sessions, RSS {m['rss_before_mib']} ->"
            f" {m['rss_idle_mib']} MiB: {m['rss_kib_per_session']} KiB RSS,"
            f" {m['pss_kib_per_session']} KiB PSS per idle session"
        )
    if "burst" in f:
        b = f["burst"]
        lines.append(
            f"== burst: {b['calls']} markdown calls at once, sent in {b['seconds_to_send']} s,"
            f" {b['answered']} answered in {b['seconds_to_last_answer']} s:"
            f" {b['answers_per_second']} answers/s; {b['succeeded']} with their result,"
            f" {b['results_per_second']} results/s"
            + (" (the rest timed out)" if b["succeeded"] < b["answered"] else "")
        )
    lines += [
        f"== {f['calls']} calls with both failures; {f['answered']} answered once",
        f"   first call -> last answer: {f['seconds_first_call_to_last_answer']} s;"
        f" {f['answers_per_second']} answers/s, markdown {f['small_answers_per_second']}/s",
        f"   markdown call -> result: p50 {f['small_call_to_result_ms_p50']} ms,"
        f" p95 {f['small_call_to_result_ms_p95']} ms",
        f"   sessions resumed on another Daphne: {f['sessions_resumed']}"
        f" (p50 {f['resume_seconds_p50']} s, max {f['resume_seconds_max']} s)",
        f"   jobs running on the killed worker node: {f['running_on_killed_worker']}",
    ]
    lines += [f"   {name}: {count}" for name, count in sorted(f["counts"].items())]
    lines.append(f"== problems: {len(outcome.problems)}")
    lines += [f"   {p}" for p in outcome.problems[:50]]
    return lines
