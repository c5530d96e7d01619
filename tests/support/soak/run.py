"""One soak: the stack, the load on every door, the faults, the checks, the report."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.support.soak import invariants, memory, report
from tests.support.soak.doors import abp
from tests.support.soak.faults import Fault, Injector
from tests.support.soak.ledger import Ledger
from tests.support.soak.load import Load, Sizes
from tests.support.soak.retention import RETENTION_SECONDS, ROW_BOUND_SECONDS
from tests.support.soak.rows import RowWatch, busy_percent
from tests.support.soak.stack import SoakStack

# How long calls still out when the load stops may take to be answered (every door's
# lane waits as long: doors/pending.py).
DRAIN_SECONDS = 45.0


@dataclass(frozen=True, kw_only=True)
class Options:
    """The soak's length, seed, faults and load."""

    minutes: float = 60.0
    seed: int = 1
    warmup: float = 15.0  # no fault before this (s)
    quiet: float = 30.0  # nor in the last seconds of the load
    faults_per_minute: float = 4.0
    sizes: Sizes = field(default_factory=Sizes)
    command: str = ""
    keep_ops: bool = False  # every call, with its timeline, in the JSON report


@dataclass
class Outcome:
    """What the soak did and found."""

    report: dict[str, Any]
    violations: list[invariants.Violation] = field(default_factory=list)


async def soak(stack: SoakStack, options: Options, faults: list[Fault]) -> Outcome:
    """Run the load and the faults for `options.minutes`, drain, check, report."""
    ledger = Ledger()
    stop_load, stop_watch = asyncio.Event(), asyncio.Event()
    rows = RowWatch(
        stack.topology.database.url, ledger, retention=RETENTION_SECONDS, bound=ROW_BOUND_SECONDS
    )
    samples: list[memory.Sample] = []
    watchers = [
        asyncio.create_task(rows.run(stop_watch)),
        # RSS against calls made: sampled while calls are made.
        asyncio.create_task(memory.sampler(stack.topology, ledger, samples, stop_load)),
    ]
    fault_rng = random.Random(f"{options.seed}/faults")
    injector = asyncio.create_task(Injector(stack, ledger, fault_rng).run(faults, stop_load))
    load = Load(stack, ledger, options.seed, stop_load)
    running = [asyncio.create_task(lane) for lane in await load.lanes(options.sizes)]
    await asyncio.wait(running, timeout=options.minutes * 60)  # lanes end themselves at stop
    stop_load.set()
    drain_until = time.monotonic() + DRAIN_SECONDS
    crashed = [r for r in await asyncio.gather(*running, return_exceptions=True) if r is not None]
    await load.drain(drain_until)
    await injector
    await asyncio.sleep(5)  # the reaper's and the clean-up's last passes
    stop_watch.set()
    await asyncio.gather(*watchers)
    await load.close()
    revoked = {a.session_id for a in load.revocable}
    violations = invariants.check(
        ledger.ops, rows, revoked=revoked, strays=load.strays(), refused=load.refused_resumes()
    )
    if ledger.counts[f"abp/{abp.OUTLIVED}"]:
        outlived = ledger.counts[f"abp/{abp.OUTLIVED}"]
        detail = f"{outlived} sessions kept 90 s after their key's revocation"
        violations.append(invariants.Violation("a revoked key's sessions end", detail, []))
    header = {
        "seed": options.seed,
        "minutes": options.minutes,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": options.command,
        "stack": "PostgreSQL 15 (private), Redis, 2 Daphnes behind HAProxy, heavy and small"
        " workers on 2 nodes, beat",
        "seconds": round(ledger.now(), 1),
    }
    found = report.as_json(
        header, ledger=ledger, faults=faults, violations=violations,
        memory=memory.slopes(samples), rows=rows,
    )  # fmt: skip
    found["memory"]["samples"] = len(samples)
    heavy_slots = stack.heavy_concurrency * sum(
        1 for name in stack.topology.workers if name.startswith("heavy@")
    )
    found["rows"]["heavy_busy_percent"] = busy_percent(rows.jobs, "heavy@", heavy_slots)
    found["sessions"] = ledger.sessions  # refused resumes' attempts, revocations
    found["harness_errors"] = [f"a lane crashed: {type(e).__name__}: {e}"[:300] for e in crashed]
    if options.keep_ops:
        found["ops"] = [dataclasses.asdict(op) for op in ledger.ops]
        found["memory"]["all_samples"] = [dataclasses.astuple(s) for s in samples]
    return Outcome(found, violations)
