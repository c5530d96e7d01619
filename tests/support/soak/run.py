"""One soak: the stack, the load on every door, the faults, the checks, the report."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.support import fleet
from tests.support.soak import invariants, memory, plan, report
from tests.support.soak.doors import abp, client, mcp, rpc
from tests.support.soak.doors.lane import Lane
from tests.support.soak.faults import Fault, Injector
from tests.support.soak.ledger import Ledger
from tests.support.soak.retention import RETENTION_SECONDS, ROW_BOUND_SECONDS
from tests.support.soak.rows import RowWatch
from tests.support.soak.stack import SoakStack

DRAIN_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True)
class Options:
    """The soak's length, seed and load."""

    minutes: float = 60.0
    seed: int = 1
    warmup: float = 15.0  # no fault before this (s)
    quiet: float = 30.0  # nor in the last seconds of the load
    faults_per_minute: float = 4.0
    abp_agents: int = 4
    abp_pace: float = 0.6  # mean seconds between an agent's calls
    drop_every: float = 45.0  # mean seconds between an agent's own socket drops
    rpc_sessions: int = 2
    rpc_pace: float = 0.8
    mcp_pace: float = 2.0  # per wire
    client_pace: float = 1.0
    browser: bool = True
    revoked_keys: bool = True
    command: str = ""
    keep_ops: bool = False  # every call, with its timeline, in the JSON report


@dataclass
class Outcome:
    """What the soak did and found."""

    report: dict[str, Any]
    violations: list[invariants.Violation] = field(default_factory=list)


def lane_rng(options: Options, name: str) -> random.Random:
    """Each lane's own generator, from the seed: one lane's draws never shift another's."""
    return random.Random(f"{options.seed}/{name}")


async def soak(stack: SoakStack, options: Options, faults: list[Fault]) -> Outcome:
    """Run the load and the faults for `options.minutes`, drain, check, report."""
    ledger = Ledger()
    mix = plan.Mix()
    stop_load, stop_watch = asyncio.Event(), asyncio.Event()
    rows = RowWatch(
        stack.topology.database.url, ledger, retention=RETENTION_SECONDS, bound=ROW_BOUND_SECONDS
    )
    samples: list[memory.Sample] = []
    watchers = [
        asyncio.create_task(rows.run(stop_watch)),
        asyncio.create_task(memory.sampler(stack.topology, ledger, samples, stop_watch)),
    ]
    injector = asyncio.create_task(
        Injector(stack, ledger, lane_rng(options, "faults")).run(faults, stop_load)
    )
    agents = fleet.Fleet([stack.ws_url], stack.key)
    abp_agents = [abp.SoakAgent(agents, n, stack.ws_url, ledger) for n in range(options.abp_agents)]
    for agent in abp_agents:
        await agent.open()
    rpc_url = stack.ws_url.replace("/abp/ws", "/abp/rpc")
    rpc_sessions = [rpc.RpcSession(rpc_url, stack.key, ledger) for _ in range(options.rpc_sessions)]
    for session in rpc_sessions:
        await session.open()
    revocable: list[abp.SoakAgent] = []

    def ctx(name: str) -> Lane:
        return Lane(ledger, lane_rng(options, name), mix, stop_load)

    lanes: list[Coroutine[Any, Any, None]] = [
        *(
            abp.lane(a, ctx(f"abp{n}"), pace=options.abp_pace, drop_every=options.drop_every)
            for n, a in enumerate(abp_agents)
        ),
        *(
            rpc.lane(s, ctx(f"rpc{n}"), pace=options.rpc_pace, drop_every=options.drop_every)
            for n, s in enumerate(rpc_sessions)
        ),
        *(
            mcp.lane(door, f"{stack.http_url}/mcp", stack.key, ctx(door), pace=options.mcp_pace)
            for door in mcp.WIRES
        ),
        client.lane(stack.ws_url, stack.key, ctx("client"), pace=options.client_pace),
    ]
    if options.revoked_keys:
        keys = abp.Keys(_key_maker(stack), _revoker(stack))
        lanes.append(abp.revoked_lane(keys, ctx("revoked"), revocable))
    if options.browser:
        from tests.support.soak.doors import browser

        lanes.append(browser.lane(stack.http_url, stack.parent_port, ctx("browser")))
    running = [asyncio.create_task(lane) for lane in lanes]
    await asyncio.wait(running, timeout=options.minutes * 60)  # lanes end themselves at stop
    stop_load.set()
    crashed = [r for r in await asyncio.gather(*running, return_exceptions=True) if r is not None]
    await drain(ledger, [*abp_agents, *revocable], rpc_sessions)
    await injector
    await asyncio.sleep(5)  # the reaper's and the clean-up's last passes
    stop_watch.set()
    await asyncio.gather(*watchers)
    for agent in [*abp_agents, *revocable]:
        await agent.close()
    for session in rpc_sessions:
        await session.close()
    revoked = {a.session_id for a in revocable}
    strays = [
        f"abp session {a.session_id}: {s}"[:300]
        for a in [*abp_agents, *revocable]
        for s in a.strays
    ]
    if ledger.counts["rpc/responses to no request"]:
        strays.append(
            f"rpc: {ledger.counts['rpc/responses to no request']} responses to no request"
        )
    violations = invariants.check(ledger.ops, rows, revoked=revoked, strays=strays)
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
    found["harness_errors"] = [f"a lane crashed: {type(e).__name__}: {e}"[:300] for e in crashed]
    if options.keep_ops:
        found["ops"] = [dataclasses.asdict(op) for op in ledger.ops]
        found["memory"]["all_samples"] = [dataclasses.astuple(s) for s in samples]
    return Outcome(found, violations)


async def drain(
    ledger: Ledger, agents: list[abp.SoakAgent], sessions: list[rpc.RpcSession]
) -> None:
    """Wait for the ABP and JSON-RPC calls still out; give up on the rest."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        if all(a.settled_all() for a in agents) and all(s.settled_all() for s in sessions):
            break
        await asyncio.sleep(0.2)
    for op in ledger.ops:
        if op.door in (abp.DOOR, rpc.DOOR) and not op.answers:
            op.give_up(ledger.now())


def _key_maker(stack: SoakStack) -> Callable[[], Awaitable[tuple[fleet.Fleet, str]]]:
    async def make() -> tuple[fleet.Fleet, str]:
        key = await asyncio.to_thread(stack.topology.create_key, f"soak-revocable-{time.time_ns()}")
        return fleet.Fleet([stack.ws_url], key), key

    return make


def _revoker(stack: SoakStack) -> Callable[[str], Awaitable[None]]:
    async def revoke(key: str) -> None:
        await asyncio.to_thread(stack.topology.manage, "revoke_agent_key", key)

    return revoke
