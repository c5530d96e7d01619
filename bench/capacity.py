"""A capacity model: what one call costs each part, and how many of each 1k-100k calls/s need.

Runs the stack (one Daphne with its local lane, the heavy and the small worker,
beat; PostgreSQL unless `--sqlite`) under `--sessions` x `--calls`
`convert.markdownToHtml` calls in flight, and measures per call:
- CPU (user + sys) of Daphne's own process, its lane's processes, each worker,
  beat, Redis, and the PostgreSQL backends serving the stack;
- Redis commands (INFO commandstats), and database transactions and rows
  written (pg_stat_database; every statement outside a transaction is one).
From those it sizes each part for 1k, 10k and 100k calls/s at 70% utilisation (a
Daphne is one core: the GIL; a Redis is one core), and says which part saturates
first. Then it checks itself: it predicts this machine's calls/s with a second
Daphne, measures it, and prints the error (goal: within 25%). The default depth
(8 x 30) fits one Daphne's lane, so both runs take the same path.

PostgreSQL is TEST_DATABASE_URL's server (as `make test-postgres`); without one, SQLite.

Run: .venv/bin/python bench/capacity.py [--rounds 3] [--sqlite] [--env KEY=VALUE]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _postgres_reachable() -> bool:
    import psycopg

    from tests.support.postgres import server_url

    try:
        psycopg.connect(server_url(), connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


if "--sqlite" not in sys.argv:
    if _postgres_reachable():
        os.environ.setdefault("ABP_TEST_DATABASE", "postgres")
    else:
        print("No PostgreSQL server at TEST_DATABASE_URL: measuring on SQLite (--sqlite).")
        sys.argv.append("--sqlite")

from bench import ws_load  # noqa: E402
from tests.support import environment  # noqa: E402

STACK = ws_load.prepare_stack("abp-bench-capacity-")

import psutil  # type: ignore[import-untyped]  # noqa: E402
import redis  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import ProcessCpu  # noqa: E402
from bench.ws_load import open_session, ours  # noqa: E402

UTILISATION = 0.7
RATES = (1_000, 10_000, 100_000)


@dataclass
class Counters:
    """Cluster-wide counters read at one moment."""

    cpu: dict[str, float]
    redis_commands: int
    transactions: int
    rows_written: int


class Meter:
    """Reads every counter the model needs, for the stack's processes."""

    def __init__(self, daphnes: dict[str, int]) -> None:
        roots = {f"{name} (own)": pid for name, pid in daphnes.items()}
        roots |= {f"{name} (tree)": pid for name, pid in daphnes.items()}
        roots |= {
            "small worker": STACK.small_worker.pid,
            "heavy worker": STACK.worker.pid,
            "beat": STACK.beat.pid,
            "redis": STACK.redis.pid,
            "client": os.getpid(),
        }
        self.daphnes = list(daphnes)
        self.processes = ProcessCpu(roots, alone=("client", *(f"{name} (own)" for name in daphnes)))
        self.redis = redis.Redis(host="127.0.0.1", port=STACK.redis_port)
        self.backends: list[psutil.Process] = []

    def read(self) -> Counters:
        cpu = self.processes.read()
        for name in self.daphnes:
            cpu[f"{name} lane"] = cpu.pop(f"{name} (tree)") - cpu[f"{name} (own)"]
        cpu["database"] = self._database_cpu()
        stats = self.redis.info("commandstats")
        commands = sum(int(entry["calls"]) for entry in stats.values())
        transactions, rows = self._database_counts()
        return Counters(cpu, commands, transactions, rows)

    def _database_cpu(self) -> float:
        if connection.vendor != "postgresql":
            return 0.0
        if not self.backends:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                self.backends = [psutil.Process(pid) for (pid,) in cursor.fetchall()]
        total = 0.0
        for backend in self.backends:
            try:
                times = backend.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def _database_counts(self) -> tuple[int, int]:
        if connection.vendor != "postgresql":
            return 0, 0
        time.sleep(1.2)  # backends flush their statistics at least every second
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated "
                "FROM pg_stat_database WHERE datname = current_database()"
            )
            transactions, rows = cursor.fetchone()
        return int(transactions), int(rows)


def per_call(before: Counters, after: Counters, calls: int) -> dict[str, float]:
    """ms of CPU per call per part, and the counts per call."""
    figures = {name: (after.cpu[name] - before.cpu[name]) * 1000 / calls for name in after.cpu}
    figures["redis commands"] = (after.redis_commands - before.redis_commands) / calls
    figures["db transactions"] = (after.transactions - before.transactions) / calls
    figures["db rows written"] = (after.rows_written - before.rows_written) / calls
    return figures


def load(
    urls: list[str], sessions: int, calls: int, rounds: int, meter: Meter
) -> tuple[float, dict[str, float]]:
    """calls/s over `rounds` bursts with sessions spread over `urls`, and the per-call costs."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        opened = loop.run_until_complete(
            asyncio.gather(*(open_session(urls[i % len(urls)]) for i in range(sessions)))
        )
        loop.run_until_complete(ours(opened, 5, "warm"))
        meter.read()  # finds the database backends, now all connected
        before = meter.read()
        seconds = sum(
            loop.run_until_complete(ours(opened, calls, f"c{time.monotonic_ns()}-{r}"))
            for r in range(rounds)
        )
        after = meter.read()
        for ws in opened:
            loop.run_until_complete(ws.close())
    finally:
        loop.close()
    total = sessions * calls * rounds
    return total / seconds, per_call(before, after, total)


def model(costs: dict[str, float]) -> list[str]:
    """The sizing table for RATES, and the part that saturates first."""
    parts = {
        "Daphnes (one core each)": costs["daphne (own)"],
        "local lane processes": costs["daphne lane"],
        "Celery worker processes": costs["small worker"] + costs["heavy worker"],
        "Redis instances (one core each)": costs["redis"],
        "PostgreSQL cores": costs["database"],
    }
    lines = ["| part | CPU ms per call | " + " | ".join(f"{r:,}/s" for r in RATES) + " |"]
    lines.append("|---|---|" + "---|" * len(RATES))
    for part, ms in parts.items():
        sizes = [max(1, math.ceil(rate * ms / 1000 / UTILISATION)) for rate in RATES]
        lines.append(f"| {part} | {ms:.2f} | " + " | ".join(str(n) for n in sizes) + " |")
    # Parts that cannot simply be multiplied: one Redis per role unless sharded, one
    # PostgreSQL primary (64 cores taken as the largest ordinary one).
    ceilings = {
        "one Redis for every role": 1000
        * UTILISATION
        / max(parts["Redis instances (one core each)"], 1e-9),
        "a 64-core PostgreSQL primary": 64
        * 1000
        * UTILISATION
        / max(parts["PostgreSQL cores"], 1e-9),
    }
    lines.append("")
    for part, ceiling in sorted(ceilings.items(), key=lambda item: item[1]):
        lines.append(
            f"- Saturates first without sharding: {part}, at about {ceiling:,.0f} calls/s."
        )
    return lines


def predicted(costs: dict[str, float], daphnes: int) -> float:
    """This machine's calls/s: its cores shared by every part, or its Daphnes' cores.

    Every core at UTILISATION, as the sizing assumes: a Daphne's event loop and its
    ORM thread take turns with the GIL and wait for the database in between, and the
    parts sharing a machine wait for each other.
    """
    cores = float(psutil.cpu_count())
    everything = sum(v for k, v in costs.items() if not k.startswith(("redis c", "db ")))
    return UTILISATION * min(cores * 1000 / everything, daphnes * 1000 / costs["daphne (own)"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=8)
    # 8 x 30 in flight fit one lane's places (1 process x 257): the check's two runs
    # then take the same path. Past them, calls overflow into Celery at twice the CPU,
    # and more so with one Daphne than with two: the costs would not carry over.
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument("--env", action="append", help="KEY=VALUE for the stack's environment")
    args = parser.parse_args()
    try:
        STACK.start()
        one_rate, costs = load(
            [STACK.ws_url],
            args.sessions,
            args.calls,
            args.rounds,
            Meter({"daphne": STACK.web.pid}),
        )
        with STACK.another_web("daphne-2") as second:
            from tests.support.waiting import eventually

            eventually(lambda: _ready(second), timeout=60, interval=0.05)
            port = int(second.rsplit(":", 1)[1])
            pid = next(
                p.pid
                for p in psutil.Process().children(recursive=True)
                if any(str(port) == a for a in p.cmdline()) and "daphne" in " ".join(p.cmdline())
            )
            two_rate, _ = load(
                [STACK.ws_url, f"ws://{second}/abp/ws"],
                args.sessions,
                args.calls,
                args.rounds,
                Meter({"daphne": STACK.web.pid, "daphne 2": pid}),
            )
    finally:
        STACK.stop()
        STACK.remove_files()
        environment.remove_database()
    report(args, one_rate, costs, two_rate)


def _ready(host: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}/readyz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def report(
    args: argparse.Namespace, one_rate: float, costs: dict[str, float], two_rate: float
) -> None:
    """The per-call costs, the model, and its check."""
    database = "SQLite" if args.sqlite else "PostgreSQL"
    print(
        f"\n## Capacity model ({database}; {args.sessions} sessions x {args.calls} "
        f"`convert.markdownToHtml` in flight, {args.rounds} rounds)\n"
    )
    print("| per call | figure |\n|---|---|")
    for name, value in costs.items():
        unit = "" if name.startswith(("redis c", "db ")) else " ms CPU"
        print(f"| {name} | {value:.2f}{unit} |")
    print()
    print("\n".join(model(costs)))
    print(f"\nOne Daphne's own core was {one_rate * costs['daphne (own)'] / 10:.0f}% busy.")
    one_predicted = predicted(costs, 1)
    two_predicted = predicted(costs, 2)
    print("\n| this machine | predicted calls/s | measured calls/s | error |\n|---|---|---|---|")
    for label, guess, seen in (
        ("1 Daphne, 3 worker processes", one_predicted, one_rate),
        ("2 Daphnes, 3 worker processes", two_predicted, two_rate),
    ):
        print(f"| {label} | {guess:.0f} | {seen:.0f} | {(guess - seen) / seen * 100:+.0f}% |")


if __name__ == "__main__":
    main()
