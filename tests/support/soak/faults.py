"""Faults, drawn from the seed, injected at their moments; they may overlap.

Each kind names what it does and to what; its recovery path is in docs/reliability.md.
Faults on one target wait for each other (a Daphne is not killed while it restarts);
faults on different targets overlap freely.

Most faults strike whatever the load is doing then. The aimed ones (`AIMED`) wait, from
their moment and for at most `AIM_BOUND_SECONDS`, for the load to reach the one moment
they are about (ledger.Moment, reported by the ABP and JSON-RPC doors), then strike;
their note says which moment was hit, or that none came.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]
import redis

from tests.support.soak.ledger import Ledger, Moment, Reached
from tests.support.soak.relay import RedisRelay
from tests.support.soak.stack import SoakStack
from tests.support.stack import port_open
from tests.support.topology import Process, warm


class Kind(enum.StrEnum):
    """The kinds of fault."""

    CHILD_KILL = "SIGKILL a worker child"
    CHILD_TERM = "SIGTERM a worker child"
    WORKER_KILL = "SIGKILL a worker"
    WORKER_TERM = "SIGTERM a worker"
    DAPHNE_KILL = "SIGKILL a Daphne"
    DAPHNE_TERM = "SIGTERM a Daphne"
    BEAT_KILL = "SIGKILL beat"
    BEAT_TERM = "SIGTERM beat"
    REDIS_KEEP = "restart Redis, keeping its data"
    REDIS_LOSE = "restart Redis, losing its data"
    POSTGRES_RESTART = "restart PostgreSQL (fast shutdown)"
    POSTGRES_KILL = "SIGKILL PostgreSQL's postmaster, then start it"
    REDIS_PATH_PAUSE = "stall the Daphnes' TCP path to Redis"
    REDIS_REFUSED_AT_RESUME = "SIGKILL a Daphne, refuse Redis at a resume's takeover notice"
    REDIS_REFUSED_AT_CANCEL = "refuse Redis as a call and its cancel arrive"


# How long a fault lasts (s), drawn between these; 0.2-3 s for the others. A refusal
# is long enough for a resume, or a call and its cancel, to cross it.
HOLDS = {
    Kind.REDIS_PATH_PAUSE: (2.0, 6.0),
    Kind.REDIS_REFUSED_AT_RESUME: (1.0, 2.5),
    Kind.REDIS_REFUSED_AT_CANCEL: (1.0, 2.5),
}
# The kinds that wait for their moment of the load.
AIMED = (Kind.REDIS_REFUSED_AT_RESUME, Kind.REDIS_REFUSED_AT_CANCEL)
# How long an aimed fault waits for its moment; it strikes anyway when none came.
AIM_BOUND_SECONDS = 20.0
# A call whose cancel follows this soon (s) is one whose cancel may win its start: the
# cancel arrives while the start still waits on Redis and the database thread (issue
# #46 saw one 160 ms behind its call, with Redis down 1.3 s).
CANCEL_WITHIN = (0.0, 0.25)
# What a Daphne logs when the takeover notice of a resume is refused
# (capabilities/transport/takeover_notice.py).
NOTICE_REFUSED = "old connection yet"


@dataclass
class Fault:
    """One fault: when (s into the run), what, on which target, and for how long."""

    at: float
    kind: Kind
    target: str
    hold: float  # seconds down (or stalled) before it comes back
    started: float | None = None
    recovered: float | None = None
    note: str = ""
    error: str = ""
    overlapped: list[int] = field(default_factory=list)  # indexes of faults running with it


def target_of(kind: Kind, rng: random.Random, stack: SoakStack) -> str:
    """What a fault hits."""
    if kind in (Kind.CHILD_KILL, Kind.CHILD_TERM, Kind.WORKER_KILL, Kind.WORKER_TERM):
        return rng.choice(sorted(stack.topology.workers))
    if kind in (Kind.DAPHNE_KILL, Kind.DAPHNE_TERM, Kind.REDIS_REFUSED_AT_RESUME):
        return rng.choice([web.process.name for web in stack.topology.webs])
    return {
        Kind.BEAT_KILL: "beat", Kind.BEAT_TERM: "beat", Kind.REDIS_KEEP: "redis",
        Kind.REDIS_LOSE: "redis", Kind.POSTGRES_RESTART: "postgres",
        Kind.POSTGRES_KILL: "postgres", Kind.REDIS_PATH_PAUSE: "relay",
        Kind.REDIS_REFUSED_AT_CANCEL: "relay",
    }[kind]  # fmt: skip


def locked(fault: Fault) -> list[str]:
    """What a fault holds while it runs: its target, and the relay if it uses it too."""
    if fault.kind is Kind.REDIS_REFUSED_AT_RESUME:
        return sorted({fault.target, "relay"})  # in one order: no two faults deadlock
    return [fault.target]


def schedule(
    rng: random.Random, stack: SoakStack, *, start: float, end: float, per_minute: float
) -> list[Fault]:
    """Every kind once (in a random order), then more at random, at random moments.

    None at all with `per_minute` 0: a run for the load alone (its memory, its rates).
    """
    if per_minute <= 0:
        return []
    count = max(len(Kind), round((end - start) / 60 * per_minute))
    kinds = list(Kind)
    rng.shuffle(kinds)
    kinds += rng.choices(list(Kind), k=count - len(kinds))
    moments = sorted(rng.uniform(start, end) for _ in kinds)
    faults = []
    for at, kind in zip(moments, kinds, strict=True):
        hold = rng.uniform(*HOLDS.get(kind, (0.2, 3.0)))
        faults.append(Fault(round(at, 2), kind, target_of(kind, rng, stack), round(hold, 2)))
    return faults


class Injector:
    """Runs the faults at their moments against the stack."""

    def __init__(
        self,
        stack: SoakStack,
        ledger: Ledger,
        rng: random.Random,
        *,
        aim_bound: float = AIM_BOUND_SECONDS,
    ) -> None:
        self.stack = stack
        self.ledger = ledger
        self.rng = rng
        self.aim_bound = aim_bound
        self._locks: dict[str, asyncio.Lock] = {}
        self.running: set[int] = set()

    async def run(self, faults: list[Fault], stop: asyncio.Event) -> None:
        """Each fault at its moment (until `stop`); waits for those started to recover."""
        tasks = []
        for index, fault in enumerate(faults):
            delay = fault.at - self.ledger.now()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except TimeoutError:
                    pass
            tasks.append(asyncio.create_task(self._one(index, fault)))
        await asyncio.gather(*tasks)

    async def _one(self, index: int, fault: Fault) -> None:
        async with contextlib.AsyncExitStack() as held:
            for name in locked(fault):
                await held.enter_async_context(self._locks.setdefault(name, asyncio.Lock()))
            fault.started = self.ledger.now()
            fault.overlapped = sorted(self.running)
            self.running.add(index)
            try:
                if fault.kind is Kind.REDIS_REFUSED_AT_RESUME:
                    fault.note = await self._refused_at_resume(fault)
                elif fault.kind is Kind.REDIS_REFUSED_AT_CANCEL:
                    fault.note = await self._refused_at_cancel(fault)
                else:
                    fault.note = await asyncio.to_thread(self._inject, fault)
            except Exception as failed:  # reported with the fault: the soak goes on
                fault.error = f"{type(failed).__name__}: {failed}"[:300]
            finally:
                self.running.discard(index)
                fault.recovered = self.ledger.now()

    # -- the aimed faults (on the event loop, where the doors report their moments) --------

    async def _refused_at_resume(self, fault: Fault) -> str:
        """Kill a Daphne; once a session it held sends its resume to the other, refuse
        Redis at that resume's takeover notice (its PUBLISH to the session's group), for
        the hold; then start the Daphne again."""
        web = next(w for w in self.stack.topology.webs if w.process.name == fault.target)
        others = [w.process for w in self.stack.topology.webs if w is not web]
        relay = self.stack.relay
        notices = sum(p.log_text().count(NOTICE_REFUSED) for p in others)
        resume = self.ledger.watch(Moment.RESUME_SENT)  # before the kill: none is missed
        killed = await asyncio.to_thread(self._stop, web.process, True)
        try:
            hit = await self._aim(resume)
            if hit is not None:
                relay.refuse_at(b"PUBLISH", session_group(hit.session))
            trapped = await self._refused(relay, self.aim_bound if hit else 0.0)
            if not trapped:  # strike anyway
                relay.refuse()
                await self._refused(relay, 1.0)
            await asyncio.sleep(fault.hold)
        finally:
            window = self._accept_again(relay)
            started = await asyncio.to_thread(self._start, web.process, lambda: warm(web.port))
        notices = sum(p.log_text().count(NOTICE_REFUSED) for p in others) - notices
        if hit is None:
            aimed = f"{Moment.RESUME_SENT.value}: none within the bound"
        else:
            at = "at its takeover notice" if trapped else "no takeover notice within the bound"
            aimed = f"hit {hit.what} {hit.session}, its resume sent at {hit.at} s; {at}"
        return f"{killed}; {aimed}; {window}; {notices} notices refused (logged); {started}"

    async def _refused_at_cancel(self, fault: Fault) -> str:
        """Refuse Redis for the hold; a call that goes out meanwhile with its cancel due
        within `CANCEL_WITHIN` keeps it refused until its cancel was sent and half a
        second more: the cancel may win the call's start, whose row meets the refusal."""
        relay = self.stack.relay
        relay.refuse()
        await self._refused(relay, 1.0)
        since = self.ledger.now()
        low, high = CANCEL_WITHIN
        call = self.ledger.watch(Moment.CANCEL_DUE, lambda r: low <= (r.cancel_in or 0) <= high)
        try:
            hit = await self._aim(call, fault.hold)
            if hit is not None:
                left = fault.hold - (self.ledger.now() - since)
                await asyncio.sleep(max(left, (hit.cancel_in or 0.0) + 0.5))
        finally:
            window = self._accept_again(relay)
        if hit is None or hit.op is None:
            return f"{Moment.CANCEL_DUE.value}: none while refused; {window}"
        op = hit.op
        cancel = "not sent" if op.cancelled_at is None else f"sent at {op.cancelled_at} s"
        answer = f"answered {op.answers[0].outcome}" if op.answers else "no answer yet"
        due = f"its cancel due {(hit.cancel_in or 0) * 1000:.0f} ms later"
        return f"hit {hit.what} at {hit.at} s, {due}; {window}; its cancel {cancel}; {answer}"

    async def _aim(
        self, moment: asyncio.Future[Reached], bound: float | None = None
    ) -> Reached | None:
        """The moment, once the load reaches it; None if it did not within the bound."""
        try:
            return await asyncio.wait_for(moment, self.aim_bound if bound is None else bound)
        except TimeoutError:  # the watch is cancelled with it: the ledger drops it
            return None

    async def _refused(self, relay: RedisRelay, bound: float) -> bool:
        """Whether the relay refuses now, or begins to within `bound` s."""
        return relay.began.is_set() or await asyncio.to_thread(relay.began.wait, bound)

    def _accept_again(self, relay: RedisRelay) -> str:
        """Redis reachable again; when it was refused (run clock), for the note."""
        began = relay.refused_at if relay.began.is_set() else None
        relay.accept_again()
        since = "never" if began is None else f"{round(began - self.ledger.started, 3)} s"
        return f"Redis refused from {since} to {self.ledger.now()} s"

    # -- the faults themselves (in a thread) ----------------------------------------------

    def _inject(self, fault: Fault) -> str:
        kind, topology = fault.kind, self.stack.topology
        if kind in (Kind.CHILD_KILL, Kind.CHILD_TERM):
            sig = signal.SIGKILL if kind is Kind.CHILD_KILL else signal.SIGTERM
            for _ in range(5):  # a child may be replaced between the listing and the signal
                children = psutil.Process(topology.workers[fault.target].pid).children()
                if children:
                    child = self.rng.choice(children)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, sig)
                        return f"child pid {child.pid}"
                time.sleep(0.5)
            return "no child to signal"
        if kind in (Kind.WORKER_KILL, Kind.WORKER_TERM):
            worker = topology.workers[fault.target]
            return self._restart(
                worker, kind is Kind.WORKER_KILL, fault.hold, _logged(worker, " ready.")
            )
        if kind in (Kind.DAPHNE_KILL, Kind.DAPHNE_TERM):
            web = next(w for w in topology.webs if w.process.name == fault.target)
            return self._restart(
                web.process, kind is Kind.DAPHNE_KILL, fault.hold, lambda: warm(web.port)
            )
        if kind in (Kind.BEAT_KILL, Kind.BEAT_TERM):
            beat = topology.beat
            return self._restart(
                beat, kind is Kind.BEAT_KILL, fault.hold, _logged(beat, "beat: Starting")
            )
        if kind in (Kind.REDIS_KEEP, Kind.REDIS_LOSE):
            return self._restart_redis(keep=kind is Kind.REDIS_KEEP, hold=fault.hold)
        if kind is Kind.POSTGRES_RESTART:
            self.stack.postgres.stop("fast")
            time.sleep(fault.hold)
            self.stack.postgres.start()
            return ""
        if kind is Kind.POSTGRES_KILL:
            self.stack.postgres.kill()
            time.sleep(fault.hold)
            self.stack.postgres.start()
            return ""
        self.stack.relay.freeze()
        time.sleep(fault.hold)
        self.stack.relay.thaw()
        return ""

    def _restart(self, process: Process, kill: bool, hold: float, ready: Callable[[], bool]) -> str:
        """Signal by PID, wait for the exit, stay down `hold` s, start it, wait until ready."""
        stopped = self._stop(process, kill)
        time.sleep(hold)
        return f"{stopped}; {self._start(process, ready)}"

    def _stop(self, process: Process, kill: bool) -> str:
        """Signal by PID and wait for the exit."""
        assert process.proc is not None
        pid = process.pid
        process.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        started = time.monotonic()
        try:
            process.proc.wait(60)
        except subprocess.TimeoutExpired:  # a SIGTERM not obeyed in a minute
            process.kill()
        return f"pid {pid} exited in {time.monotonic() - started:.1f} s"

    def _start(self, process: Process, ready: Callable[[], bool]) -> str:
        """Start it and wait until ready."""
        process.launch()
        process.wait_ready(ready, 120)
        return f"up again as {process.pid}"

    def _restart_redis(self, *, keep: bool, hold: float) -> str:
        process = self.stack.topology.redis
        assert process.proc is not None
        dump = self.stack.topology.run_dir / "dump.rdb"
        if keep:
            client = redis.Redis(port=self.stack.topology.redis_port, socket_timeout=30)
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(save=True)  # SAVE, then exit: nothing written is lost
            process.proc.wait(60)
        else:
            process.kill()
            dump.unlink(missing_ok=True)
        time.sleep(hold)
        process.launch()
        process.wait_ready(lambda: port_open(self.stack.topology.redis_port), 60)
        return f"dump.rdb {'kept' if dump.exists() else 'gone'}"


def session_group(session: str) -> bytes:
    """A session's channel-layer group, as its PUBLISH names it (models.session_group)."""
    return f"abp.session.{uuid.UUID(session).hex}".encode()


def _logged(process: Process, marker: str) -> Callable[[], bool]:
    """Ready once its log has `marker` once more than now (the log is appended to)."""
    before = process.log_text().count(marker)
    return lambda: process.log_text().count(marker) > before
