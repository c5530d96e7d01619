"""A small call against a bare Celery round trip, and what one small call costs.

In one run, against one Redis, with the same kind of client (a blocking call, then
the next, no idle gaps): rounds that interleave blocks of bare Celery
`apply_async().get()` round trips with blocks of small calls over `/abp/ws`
(`convert.markdownToHtml` on the small worker, `test.sleep {steps: 0}` on the heavy
one). Prints:
- p50/p99 of each, the ratio of p50s, and the median over rounds of each round's ratio;
- CPU per call of the processes involved (the stack's Daphne, worker and Redis; the
  bare worker and Redis; the client), less what they burn idle;
- per call: Redis commands (INFO commandstats) and, with the stack restarted with a
  statement counter in each process (a `sitecustomize` adding a Django
  `execute_wrapper`; beat stopped, so no reaper), the SQL statements each process ran.

Run: .venv/bin/python bench/small_call_trace.py [--rounds 8] [--block 25] [--count 100]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment
from tests.support.stack import ManagedProcess, python_tool

STACK = environment.prepare("abp-bench-")

import psutil  # type: ignore[import-untyped]  # noqa: E402
import redis  # noqa: E402

from bench import stats  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

MARKDOWN: dict[str, object] = {
    "markdown": "# Hello\n\nSome *text* and a [link](https://example.com)."
}
SLEEP: dict[str, object] = {"steps": 0}

# Loaded by every Python process of the restarted stack (PYTHONPATH): appends one
# line per SQL statement to a file of its process, so the bench can count them.
SQL_COUNTER = """
import os, sys
_dir = os.environ.get("ABP_BENCH_SQL_DIR")
if _dir:
    from django.db.backends.signals import connection_created

    def _role():
        argv = " ".join(sys.argv)
        if "daphne" in argv:
            return "daphne"
        for queue in ("abp.small", "abp.heavy"):
            if queue in argv:
                return "worker " + queue
        return "other"

    def _count(execute, sql, params, many, context):
        with open(os.path.join(_dir, f"{_role()}.{os.getpid()}.sql"), "a") as out:
            out.write(" ".join(str(sql).split())[:110] + "\\n")
        return execute(sql, params, many, context)

    def _install(sender, connection, **kwargs):
        # Once per connection object: Celery closes and reopens the same one.
        if _count not in connection.execute_wrappers:
            connection.execute_wrappers.append(_count)

    connection_created.connect(_install, weak=False)
"""


@dataclass
class Series:
    """One kind of round trip: its latencies, and its CPU per block."""

    name: str
    call: Callable[[], None]
    processes: Callable[[], list[psutil.Process]]
    latencies: list[float] = field(default_factory=list)
    round_p50s: list[float] = field(default_factory=list)
    cpu_per_call: list[float] = field(default_factory=list)
    client_cpu_per_call: list[float] = field(default_factory=list)


def tree(pid: int) -> list[psutil.Process]:
    """A process and its children (prefork pools)."""
    parent = psutil.Process(pid)
    return [parent, *parent.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU of the processes so far (children that died are not counted)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def idle_cpu_rate(processes: list[psutil.Process], seconds: float = 2.0) -> float:
    """CPU seconds per second the processes burn while nobody calls."""
    before = cpu_seconds(processes)
    time.sleep(seconds)
    return (cpu_seconds(processes) - before) / seconds


def run_block(series: Series, n: int, idle_rate: float) -> None:
    """n calls back to back: their latencies, and the CPU per call above idle."""
    processes = series.processes()
    times = []
    cpu_before, client_before = cpu_seconds(processes), time.process_time()
    wall = time.perf_counter()
    for _ in range(n):
        start = time.perf_counter()
        series.call()
        times.append((time.perf_counter() - start) * 1000)
    wall = time.perf_counter() - wall
    used = cpu_seconds(processes) - cpu_before - idle_rate * wall
    series.cpu_per_call.append(max(used, 0.0) / n * 1000)
    series.client_cpu_per_call.append((time.process_time() - client_before) / n * 1000)
    series.latencies += times
    series.round_p50s.append(statistics.median(times))


def command_counts(client: redis.Redis) -> collections.Counter[str]:
    """Redis commands run so far, by name."""
    info = client.info("commandstats")
    return collections.Counter(
        {name[len("cmdstat_") :]: int(v["calls"]) for name, v in info.items()}
    )


def redis_per_call(client: redis.Redis, call: Callable[[], None], n: int) -> dict[str, float]:
    """Redis commands per call, less what the stack runs idle in the same time."""
    before = command_counts(client)
    start = time.perf_counter()
    for _ in range(n):
        call()
    wall = time.perf_counter() - start
    during = command_counts(client) - before
    idle_before = command_counts(client)
    time.sleep(wall)
    idle = command_counts(client) - idle_before
    idle["info"] += 1  # our own INFO
    during["info"] += 1
    return {
        name: (during[name] - idle.get(name, 0)) / n
        for name in during
        if (during[name] - idle.get(name, 0)) / n >= 0.05
    }


def print_counts(label: str, counts: dict[str, float]) -> None:
    total = sum(counts.values())
    detail = ", ".join(f"{name} {n:.2f}" for name, n in sorted(counts.items(), key=lambda i: -i[1]))
    print(f"  {label:<40} {total:5.2f} per call  ({detail})")


def sql_per_call(sql_dir: Path, n: int) -> None:
    """Print the SQL statements per call, by process, from the counter's files."""
    by_role: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for path in sql_dir.glob("*.sql"):
        role = path.name.split(".")[0] + (
            "." + path.name.split(".")[1] if path.name.startswith("worker") else ""
        )
        for line in path.read_text().splitlines():
            by_role[role][line] += 1
    total = 0.0
    for role, statements in sorted(by_role.items()):
        count = sum(statements.values()) / n
        total += count
        print(f"  {role}: {count:.2f} statements per call")
        for text, seen in statements.most_common():
            if seen / n >= 0.05:
                print(f"    {seen / n:5.2f}  {text}")
    print(f"  total: {total:.2f} SQL statements per call")


def restart_with_sql_counter(sql_dir: Path) -> None:
    """Daphne and both workers again, each with the statement counter; beat stopped."""
    site = Path(tempfile.mkdtemp(prefix="abp-bench-site-"))
    (site / "sitecustomize.py").write_text(SQL_COUNTER)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ["ABP_BENCH_SQL_DIR"] = str(sql_dir)
    STACK.beat.stop()
    STACK.web.stop()
    STACK.worker.stop()
    STACK.small_worker.stop()
    small = ManagedProcess(
        "worker-abp.small-counted",
        python_tool(
            "celery", "-A", "abpsite", "worker", "-Q", "abp.small", "-P", "prefork", "-c", "1",
            "-l", "info", "-n", f"small-counted-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle",
        ),
        STACK.run_dir,
    )  # fmt: skip
    small.start(lambda: " ready." in small.log_text())
    STACK.small_worker = small
    STACK.start_worker()
    STACK.start_web()
    # The stack's workers count only once their pools exist: let them settle.
    time.sleep(1.0)
    for path in sql_dir.glob("*.sql"):
        path.unlink()


def timed_rounds(series: list[Series], rounds: int, block: int) -> None:
    """Warm up, then `rounds` rounds of one block of each series; print what they took."""
    for one in series:
        for _ in range(30):
            one.call()
    idle = {one.name: idle_cpu_rate(one.processes()) for one in series}
    for round_ in range(rounds):
        # Each round in another order, so no series always follows the same one.
        order = series[round_ % len(series) :] + series[: round_ % len(series)]
        for one in order:
            run_block(one, block, idle[one.name])
    print(f"\n== small call round trip ({rounds} rounds of {block} each)")
    baseline = stats.summary(series[0].latencies)["p50"]
    for one in series:
        print(stats.line(one.name, one.latencies, baseline))
    print("\n  median over rounds of the round's p50 ratio to bare Celery:")
    for one in series[1:]:
        ratios = [a / b for a, b in zip(one.round_p50s, series[0].round_p50s, strict=True)]
        print(
            f"  {one.name:<46} {statistics.median(ratios):5.2f}x"
            f"  (rounds: {min(ratios):.2f}-{max(ratios):.2f})"
        )
    print("\n  CPU per call, above idle (median of blocks), ms:")
    for one in series:
        print(
            f"  {one.name:<46} servers {statistics.median(one.cpu_per_call):5.2f}"
            f"   client {statistics.median(one.client_cpu_per_call):5.2f}"
        )


def count_sql(sql_dir: Path, n: int) -> None:
    """Restart the stack with the statement counter; count each small call's statements."""
    restart_with_sql_counter(sql_dir)
    with Agent(STACK.ws_url) as agent:
        agent.initialize()
        for capability, params in (("convert.markdownToHtml", MARKDOWN), ("test.sleep", SLEEP)):
            for _ in range(5):  # connections and caches warm
                agent.result_of(agent.call(capability, params))
            agent.inbox.clear()
            for path in sql_dir.glob("*.sql"):
                path.unlink()
            for _ in range(n):
                agent.result_of(agent.call(capability, params))
                agent.inbox.clear()
            time.sleep(0.3)
            print(f"\n== SQL statements per call: {capability} ({n} calls)")
            sql_per_call(sql_dir, n)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=25, help="calls per block")
    parser.add_argument("--count", type=int, default=100, help="calls for the per-call counts")
    parser.add_argument("--no-sql", action="store_true", help="skip the SQL statement count")
    args = parser.parse_args()
    bare = ManagedProcess(
        "bare-worker",
        python_tool(
            "celery", "-A", "bench.bare_celery", "worker", "-P", "prefork", "-c", "2",
            "-Q", "bare", "-n", "bare@%h", "-l", "info", "--without-gossip", "--without-mingle",
        ),
        STACK.run_dir,
    )  # fmt: skip
    try:
        STACK.start()
        bare.start(lambda: " ready." in bare.log_text())
        from bench.bare_celery import echo

        with Agent(STACK.ws_url) as agent:
            agent.initialize()

            def small_call(capability: str, params: dict[str, object]) -> Callable[[], None]:
                def call() -> None:
                    reply = agent.result_of(agent.call(capability, params))
                    assert reply["payload"].get("success"), reply
                    agent.inbox.clear()

                return call

            def stack_processes(worker: ManagedProcess) -> Callable[[], list[psutil.Process]]:
                return lambda: [
                    *tree(STACK.web.pid),
                    *tree(worker.pid),
                    psutil.Process(STACK.redis.pid),
                ]

            series = [
                Series(
                    "bare Celery apply_async().get()",
                    lambda: echo.apply_async(args=(1,)).get(timeout=10),
                    lambda: [*tree(bare.pid), psutil.Process(STACK.redis.pid)],
                ),
                Series(
                    "convert.markdownToHtml over /abp/ws",
                    small_call("convert.markdownToHtml", MARKDOWN),
                    stack_processes(STACK.small_worker),
                ),
                Series(
                    "test.sleep {steps: 0} over /abp/ws",
                    small_call("test.sleep", SLEEP),
                    stack_processes(STACK.worker),
                ),
            ]
            timed_rounds(series, args.rounds, args.block)
            print(f"\n== Redis commands per call ({args.count} calls, less idle)")
            client = redis.Redis(port=STACK.redis_port)
            for one in series:
                print_counts(one.name, redis_per_call(client, one.call, args.count))
        if not args.no_sql:
            count_sql(Path(tempfile.mkdtemp(prefix="abp-bench-sql-")), args.count)
    finally:
        bare.stop()
        STACK.stop()
        STACK.remove_files()


if __name__ == "__main__":
    main()
