"""RSS of the Daphnes, the workers and their children, sampled against calls made.

Each process (by PID: a restarted one is a new series) gets a least-squares slope of
its RSS against the calls made so far, once warm (its first `WARM_SECONDS`, or its
first third if longer, left out), in KiB per 1,000 calls. A role's slope is the median
over its series long enough to judge; it must stay under `BOUND_KIB_PER_1000_CALLS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped]

from tests.support.soak.ledger import Ledger
from tests.support.topology import Process, Topology

BOUND_KIB_PER_1000_CALLS = 1024.0
WARM_SECONDS = 60.0
# A series is judged only over this many calls and samples (shorter ones are noise).
MIN_CALLS = 1000
MIN_SAMPLES = 6


@dataclass(frozen=True)
class Sample:
    """One process's RSS at a moment."""

    at: float
    calls: int
    role: str
    name: str
    pid: int
    rss_kib: int


def roles(topology: Topology) -> list[tuple[str, Process]]:
    """(role, process) of everything sampled."""
    found = [("daphne", web.process) for web in topology.webs]
    found += [(name.split("@")[0] + " worker", worker) for name, worker in topology.workers.items()]
    return found


def sample(topology: Topology, at: float, calls: int) -> list[Sample]:
    """Every process's RSS, and its children's (a Daphne's local lane, a worker's pool)."""
    samples = []
    for role, process in roles(topology):
        if not process.alive():
            continue
        with contextlib.suppress(psutil.Error):
            main = psutil.Process(process.pid)
            samples.append(
                Sample(at, calls, role, process.name, main.pid, main.memory_info().rss // 1024)
            )
            for child in main.children():
                with contextlib.suppress(psutil.Error):
                    rss = child.memory_info().rss // 1024
                    samples.append(Sample(at, calls, f"{role} child", process.name, child.pid, rss))
    return samples


async def sampler(
    topology: Topology, ledger: Ledger, found: list[Sample], stop: asyncio.Event
) -> None:
    """Sample every 5 s until `stop`."""
    while not stop.is_set():
        found.extend(await asyncio.to_thread(sample, topology, ledger.now(), ledger.calls_so_far()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y on x."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


@dataclass(frozen=True)
class RoleSlope:
    """A role's RSS slope (KiB per 1,000 calls): median and max over its judged series."""

    role: str
    series: int
    judged: int
    median: float | None
    maximum: float | None
    last_rss_kib: int

    @property
    def flat(self) -> bool | None:
        """Under the bound (None: nothing long enough to judge)."""
        return None if self.median is None else self.median < BOUND_KIB_PER_1000_CALLS


def slopes(samples: list[Sample]) -> list[RoleSlope]:
    """Each role's slope."""
    series: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        series.setdefault((s.role, s.pid), []).append(s)
    by_role: dict[str, list[list[Sample]]] = {}
    for (role, _), points in series.items():
        by_role.setdefault(role, []).append(points)
    found = []
    for role, all_series in sorted(by_role.items()):
        judged = []
        for points in all_series:
            warm_from = points[0].at + max(WARM_SECONDS, (points[-1].at - points[0].at) / 3)
            warm = [p for p in points if p.at >= warm_from]
            if len(warm) >= MIN_SAMPLES and warm[-1].calls - warm[0].calls >= MIN_CALLS:
                judged.append(1000 * slope([(p.calls, p.rss_kib) for p in warm]))
        last = max(all_series, key=lambda points: points[-1].at)[-1].rss_kib
        found.append(
            RoleSlope(
                role, len(all_series), len(judged),
                round(statistics.median(judged), 1) if judged else None,
                round(max(judged), 1) if judged else None, last,
            )
        )  # fmt: skip
    return found
