"""RSS of the Daphnes, the workers and their children, sampled against calls made.

Two judges, each in KiB per 1,000 calls and under `BOUND_KIB_PER_1000_CALLS`:

- **Each process's slope** (by PID: a restarted one is a new series): least squares
  of its RSS against the calls made so far, once warm (its first third left out, at
  least `WARM_SECONDS`), for a process that lived `LONG_SECONDS` and `MIN_CALLS`. A
  role's slope is the median over those. A shorter life is mostly the filling-up of a
  new process (a Daphne takes minutes to take in the sessions that move to it), not
  a leak, so a run with a fault every few seconds judges few processes this way.
- **The role's ceiling over the run**: its highest RSS in the run's last third
  against its first third, per 1,000 calls made in between. Whatever the faults
  restart, memory that climbs over the hour shows here.
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
# A series is judged only over this long, this many calls and samples.
LONG_SECONDS = 600.0
MIN_CALLS = 1000
MIN_SAMPLES = 6
# The ceilings are compared only in a run this long (its thirds outlast start-up).
CEILING_RUN_SECONDS = 900.0


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
    """A role's RSS judged both ways (KiB per 1,000 calls)."""

    role: str
    series: int
    judged: int
    median: float | None
    """The median slope of the processes that lived long enough; None if none did."""
    maximum: float | None
    last_rss_kib: int
    ceiling_first_kib: int | None = None
    ceiling_last_kib: int | None = None
    ceiling_growth: float | None = None
    """The ceiling's rise from the first third to the last; None in a short run."""

    @property
    def flat(self) -> bool | None:
        """Both judges under the bound (None: neither could judge)."""
        verdicts = [
            value < BOUND_KIB_PER_1000_CALLS
            for value in (self.median, self.ceiling_growth)
            if value is not None
        ]
        return all(verdicts) if verdicts else None


def slopes(samples: list[Sample]) -> list[RoleSlope]:
    """Each role's slope and ceiling."""
    series: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        series.setdefault((s.role, s.pid), []).append(s)
    by_role: dict[str, list[list[Sample]]] = {}
    for (role, _), points in series.items():
        by_role.setdefault(role, []).append(points)
    found = []
    for role, all_series in sorted(by_role.items()):
        judged = [v for v in (_process_slope(points) for points in all_series) if v is not None]
        last = max(all_series, key=lambda points: points[-1].at)[-1].rss_kib
        first_kib, last_kib, growth = _ceilings([s for s in samples if s.role == role], samples)
        found.append(
            RoleSlope(
                role, len(all_series), len(judged),
                round(statistics.median(judged), 1) if judged else None,
                round(max(judged), 1) if judged else None, last,
                first_kib, last_kib, growth,
            )
        )  # fmt: skip
    return found


def _process_slope(points: list[Sample]) -> float | None:
    """One process's slope once warm; None if it did not live long enough to judge."""
    lived = points[-1].at - points[0].at
    if lived < LONG_SECONDS:
        return None
    warm_from = points[0].at + max(WARM_SECONDS, lived / 3)
    warm = [p for p in points if p.at >= warm_from]
    if len(warm) < MIN_SAMPLES or warm[-1].calls - warm[0].calls < MIN_CALLS:
        return None
    return 1000 * slope([(p.calls, p.rss_kib) for p in warm])


def _ceilings(
    role: list[Sample], everything: list[Sample]
) -> tuple[int | None, int | None, float | None]:
    """The role's highest RSS in the run's first and last thirds, and the rise per 1,000
    calls between the thirds' middles; Nones in a run too short to compare."""
    start, end = everything[0].at, everything[-1].at
    if end - start < CEILING_RUN_SECONDS:
        return None, None, None
    third = (end - start) / 3
    first = [s for s in role if s.at < start + third]
    last = [s for s in role if s.at >= end - third]
    if not first or not last:
        return None, None, None
    high_first = max(s.rss_kib for s in first)
    high_last = max(s.rss_kib for s in last)
    calls_between = statistics.median(s.calls for s in last) - statistics.median(
        s.calls for s in first
    )
    if calls_between <= 0:
        return high_first, high_last, None
    return high_first, high_last, round(1000 * (high_last - high_first) / calls_between, 1)
