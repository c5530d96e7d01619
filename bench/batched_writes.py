"""What a start's writes cost Daphne one at a time and batched (calls/job_writes.py).

In-process, on a fresh database (SQLite unless DATABASE_URL says otherwise), with
`--active` running jobs of one principal already stored (calls in flight):
- the slot counts (one SUM over the active jobs), per call;
- a new row, autocommitted alone, and in batches of 32 in one transaction;
- a start's rows through the batched hop (`job_writes._create_all`) against one
  `budgets.create_job` per call, the way each start went before;
- a hop to the database thread, one at a time and 32 at once through a HopBatch.

Run: .venv/bin/python bench/batched_writes.py [--active 1200] [--calls 640]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

environment.prepare("abp-bench-")

from channels.db import database_sync_to_async  # noqa: E402
from django.db import transaction  # noqa: E402

from capabilities.access import agent_keys  # noqa: E402
from capabilities.access.principal import Principal  # noqa: E402
from capabilities.calls import availability, budgets, job_writes  # noqa: E402
from capabilities.jobs import lifecycle, slot_counts  # noqa: E402
from capabilities.jobs.hop_batches import HopBatch, run_each  # noqa: E402
from capabilities.models import AgentSession  # noqa: E402

LANE = "local@bench:1"
BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--active", type=int, default=1200)
    parser.add_argument("--calls", type=int, default=640)
    args = parser.parse_args()
    # No Redis here: every queue has a live worker.
    availability.unavailable = lambda capability: None
    key, _ = agent_keys.create_key("bench", max_concurrent_calls=10**6, max_queued_calls=10**6)
    who = Principal(kind="key", key=key, client_address="127.0.0.1")
    session_id = str(uuid.uuid4())
    AgentSession.objects.create(id=session_id)
    numbers = iter(range(10**9))

    def fields() -> dict[str, Any]:
        return {
            "session_id": session_id,
            "call_id": f"c-{next(numbers)}",
            "request_id": "r",
            "capability": "convert.markdownToHtml",
            "params": {"markdown": "# Title"},
            "timeout_ms": 30_000,
            "progress_token": None,
            "run_by": LANE,
        }

    def row() -> None:
        values = fields()
        values.pop("run_by")
        lifecycle.create_job(principal=who.rate_limit_id, run_by=LANE, **values)

    for _ in range(args.active):
        row()
    n = args.calls
    print(f"== {args.active} active jobs of one principal; {n} calls each (us per call)")
    counts = _per_call(n, lambda: slot_counts.slot_counts("abp.small", who.rate_limit_id))
    print(f"slot counts (one SUM over the active jobs)   {counts:8.1f}")
    print(f"a new row, autocommitted alone               {_per_call(n, row):8.1f}")

    def rows_in_batches() -> None:
        for _ in range(n // BATCH):
            with transaction.atomic():
                for _ in range(BATCH):
                    row()

    print(f"a new row, {BATCH} in one transaction             {_timed(rows_in_batches) / n:8.1f}")

    def alone() -> None:
        budgets.create_job(who, **fields())

    print(f"a start's row and counts, one at a time      {_per_call(n, alone):8.1f}")

    def batched() -> None:
        for _ in range(n // BATCH):
            job_writes._create_all(
                [job_writes.NewJob(principal=who, job=fields()) for _ in range(BATCH)]
            )

    print(f"a start's row and counts, {BATCH} in one hop      {_timed(batched) / n:8.1f}")
    asyncio.run(_hops(n))


def _per_call(n: int, work: Callable[[], object]) -> float:
    def all_of_them() -> None:
        for _ in range(n):
            work()

    return _timed(all_of_them) / n


def _timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1e6


def _pair(wall: float, used: float, n: int) -> str:
    return f"{wall / n * 1e6:8.1f} {used / n * 1e6:8.1f}"


async def _hops(n: int) -> None:
    def nothing() -> int:
        return 1

    one = database_sync_to_async(nothing)
    for _ in range(50):
        await one()
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*[one() for _ in range(n)])
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"\n== a hop to the database thread, {n} at once (us per hop: wall, CPU)")
    print(
        f"one hop each                                 {wall / n * 1e6:8.1f} {used / n * 1e6:8.1f}"
    )
    batch: HopBatch[int, int] = HopBatch(lambda items: run_each(items, lambda item: item))
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*[batch.submit(i) for i in range(n)])
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"through a HopBatch ({BATCH} a hop)                {_pair(wall, used, n)}")
    print(f"\n== a hop to the database thread, {n} one after the other (us per hop: wall, CPU)")
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await one()
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"one hop each                                 {_pair(wall, used, n)}")
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        await batch.submit(i)
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"through a HopBatch (a batch of one)          {_pair(wall, used, n)}")


if __name__ == "__main__":
    main()
