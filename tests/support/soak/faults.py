"""Faults, drawn from the seed, injected at their moments; they may overlap.

Each kind names what it does and to what; its recovery path is in docs/reliability.md.
Faults on one target wait for each other (a Daphne is not killed while it restarts);
faults on different targets overlap freely.
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
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]
import redis

from tests.support.soak.ledger import Ledger
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
    if kind in (Kind.DAPHNE_KILL, Kind.DAPHNE_TERM):
        return rng.choice([web.process.name for web in stack.topology.webs])
    return {
        Kind.BEAT_KILL: "beat", Kind.BEAT_TERM: "beat", Kind.REDIS_KEEP: "redis",
        Kind.REDIS_LOSE: "redis", Kind.POSTGRES_RESTART: "postgres",
        Kind.POSTGRES_KILL: "postgres", Kind.REDIS_PATH_PAUSE: "relay",
    }[kind]  # fmt: skip


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
        hold = rng.uniform(2.0, 6.0) if kind is Kind.REDIS_PATH_PAUSE else rng.uniform(0.2, 3.0)
        faults.append(Fault(round(at, 2), kind, target_of(kind, rng, stack), round(hold, 2)))
    return faults


class Injector:
    """Runs the faults at their moments against the stack."""

    def __init__(self, stack: SoakStack, ledger: Ledger, rng: random.Random) -> None:
        self.stack = stack
        self.ledger = ledger
        self.rng = rng
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
        lock = self._locks.setdefault(fault.target, asyncio.Lock())
        async with lock:
            fault.started = self.ledger.now()
            fault.overlapped = sorted(self.running)
            self.running.add(index)
            try:
                fault.note = await asyncio.to_thread(self._inject, fault)
            except Exception as failed:  # reported with the fault: the soak goes on
                fault.error = f"{type(failed).__name__}: {failed}"[:300]
            finally:
                self.running.discard(index)
                fault.recovered = self.ledger.now()

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
        assert process.proc is not None
        pid = process.pid
        process.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        started = time.monotonic()
        try:
            process.proc.wait(60)
        except subprocess.TimeoutExpired:  # a SIGTERM not obeyed in a minute
            process.kill()
        exited = time.monotonic() - started
        time.sleep(hold)
        process.launch()
        process.wait_ready(ready, 120)
        return f"pid {pid} exited in {exited:.1f} s; up again as {process.pid}"

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


def _logged(process: Process, marker: str) -> Callable[[], bool]:
    """Ready once its log has `marker` once more than now (the log is appended to)."""
    before = process.log_text().count(marker)
    return lambda: process.log_text().count(marker) > before
