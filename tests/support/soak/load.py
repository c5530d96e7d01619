"""The load: every door's lanes, opened, run until the stop, drained, closed."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tests.support import fleet
from tests.support.soak import plan
from tests.support.soak.doors import abp, client, mcp, mcp_tasks, rpc
from tests.support.soak.doors.lane import Lane
from tests.support.soak.ledger import Ledger
from tests.support.soak.stack import SoakStack


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How many clients of each door, and how often they call (mean seconds between)."""

    abp_agents: int = 4
    abp_pace: float = 0.6
    drop_every: float = 45.0  # mean seconds between a client's own socket drops
    rpc_sessions: int = 2
    rpc_pace: float = 0.8
    mcp_pace: float = 2.0  # per wire
    client_pace: float = 1.0
    browser: bool = True
    revoked_keys: bool = True


@dataclass
class Load:
    """The clients whose calls are drained after the stop (ABP, JSON-RPC), and the lanes."""

    stack: SoakStack
    ledger: Ledger
    seed: int
    stop: asyncio.Event
    agents: list[abp.SoakAgent] = field(default_factory=list)
    revocable: list[abp.SoakAgent] = field(default_factory=list)
    sessions: list[rpc.RpcSession] = field(default_factory=list)

    def lane(self, name: str) -> Lane:
        """A lane's context, its random draws its own (one lane never shifts another's)."""
        return Lane(self.ledger, random.Random(f"{self.seed}/{name}"), plan.Mix(), self.stop)

    async def lanes(self, sizes: Sizes) -> list[Coroutine[Any, Any, None]]:
        """Open the ABP and JSON-RPC sessions; every lane, to run."""
        stack, ledger = self.stack, self.ledger
        agents = fleet.Fleet([stack.ws_url], stack.key)
        self.agents = [
            abp.SoakAgent(agents, n, stack.ws_url, ledger) for n in range(sizes.abp_agents)
        ]
        rpc_url = stack.ws_url.replace("/abp/ws", "/abp/rpc")
        self.sessions = [
            rpc.RpcSession(rpc_url, stack.key, ledger) for _ in range(sizes.rpc_sessions)
        ]
        for agent in self.agents:
            await agent.open()
        for session in self.sessions:
            await session.open()
        drops, mcp_url = sizes.drop_every, f"{stack.http_url}/mcp"
        lanes = [
            *(abp.lane(a, self.lane(f"abp{n}"), pace=sizes.abp_pace, drop_every=drops)
              for n, a in enumerate(self.agents)),
            *(rpc.lane(s, self.lane(f"rpc{n}"), pace=sizes.rpc_pace, drop_every=drops)
              for n, s in enumerate(self.sessions)),
            *(mcp.lane(door, mcp_url, stack.key, self.lane(door), pace=sizes.mcp_pace)
              for door in mcp.WIRES),
            mcp_tasks.lane(mcp_url, stack.key, self.lane("mcptasks"), pace=sizes.mcp_pace),
            client.lane(stack.ws_url, stack.key, self.lane("client"), pace=sizes.client_pace,
                        drop_every=drops),
        ]  # fmt: skip
        if sizes.revoked_keys:
            keys = abp.Keys(_key_maker(stack), _revoker(stack))
            lanes.append(abp.revoked_lane(keys, self.lane("revoked"), self.revocable))
        if sizes.browser:
            from tests.support.soak.doors import browser

            lanes.append(browser.lane(stack.http_url, stack.parent_site, self.lane("browser")))
        return lanes

    async def drain(self, until: float) -> None:
        """Wait (until `until`) for the ABP and JSON-RPC calls still out; give up on the rest."""
        agents = [*self.agents, *self.revocable]
        while time.monotonic() < until:
            if all(a.settled_all() for a in agents) and all(s.settled_all() for s in self.sessions):
                break
            await asyncio.sleep(0.2)
        for op in self.ledger.ops:
            if op.door in (abp.DOOR, rpc.DOOR) and not op.answers:
                op.give_up(self.ledger.now())

    async def close(self) -> None:
        """Close every ABP and JSON-RPC socket."""
        for agent in [*self.agents, *self.revocable]:
            await agent.close()
        for session in self.sessions:
            await session.close()

    def refused_resumes(self) -> dict[str, str]:
        """The ABP and JSON-RPC sessions whose resume the server refused: what they were told."""
        sessions: list[abp.SoakAgent | rpc.RpcSession] = [
            *self.agents, *self.revocable, *self.sessions,
        ]  # fmt: skip
        return {
            s.session_id: s.failure
            for s in sessions
            if s.failure is not None and s.failure.startswith("resume refused")
        }

    def strays(self) -> list[str]:
        """Frames that answered no call of their session."""
        found = [
            f"abp session {a.session_id}: {s}"[:300]
            for a in [*self.agents, *self.revocable]
            for s in a.strays
        ]
        count = self.ledger.counts["rpc/responses to no request"]
        return found + ([f"rpc: {count} responses to no request"] if count else [])


def _key_maker(stack: SoakStack) -> Callable[[], Awaitable[tuple[fleet.Fleet, str]]]:
    async def make() -> tuple[fleet.Fleet, str]:
        for attempt in range(30):  # a fault (PostgreSQL down) may have the command fail
            try:
                name = f"soak-revocable-{time.time_ns()}"
                key = await asyncio.to_thread(stack.topology.create_key, name)
            except RuntimeError:
                if attempt == 29:
                    raise
                await asyncio.sleep(2.0)
                continue
            return fleet.Fleet([stack.ws_url], key), key
        raise AssertionError("unreachable")

    return make


def _revoker(stack: SoakStack) -> Callable[[str], Awaitable[None]]:
    async def revoke(key: str) -> None:
        await asyncio.to_thread(stack.topology.manage, "revoke_agent_key", key)

    return revoke
