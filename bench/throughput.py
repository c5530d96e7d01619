"""Calls per second with many in flight, against bare Celery at the same depth, in one run.

One stack (Redis, Daphne with its local lane, the Celery workers, beat) and a bare
Celery worker (2 prefork processes, a noop task) side by side. In alternating
rounds:
- ours: `--sessions` WebSocket sessions each send `--calls` `convert.markdownToHtml`
  calls at once, all in flight; the round ends when every call has its result;
- bare: as many `apply_async()` sent at once, then every `.get()`;
then a batch: one session sends `--batch` calls at once (sent, fully answered).
Prints calls/s of each side and their ratio per round, and the CPU per call of each
process (user + sys, psutil): the saturated part shows.

`--env ABP_LOCAL_LANE_PROCESSES=0` measures the Celery path alone; `--profile DIR`
keeps py-spy's collapsed stacks of the first round (bench/profile_summary.py reads them).

Run: .venv/bin/python bench/throughput.py [--rounds 3] [--sessions 8] [--calls 150]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ws_load

STACK = ws_load.prepare_stack("abp-bench-throughput-")


from bench.common import ProcessCpu, bare_worker  # noqa: E402
from bench.ws_load import burst, open_session, ours  # noqa: E402


def bare(total: int) -> float:
    """Seconds for `total` bare Celery noop tasks, all sent at once, every result read."""
    from bench.bare_celery import echo

    start = time.perf_counter()
    results = [echo.apply_async(args=(1,)) for _ in range(total)]
    for result in results:
        result.get(timeout=120)
    return time.perf_counter() - start


def profile(folder: Path, cpu: ProcessCpu) -> list[subprocess.Popen[bytes]]:
    """py-spy (collapsed stacks, children included) on each stack process for 8 s."""
    folder.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    spies = []
    for name in ("daphne + lane", "small worker", "beat"):
        out = folder / f"{name.split()[0]}.txt"
        pid = str(cpu.roots[name].pid)
        command = [spy, "record", "--subprocesses", "--format", "raw", "--duration", "8"]
        command += ["--rate", "200", "--nonblocking", "--pid", pid, "-o", str(out)]
        spies.append(
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
    return spies


@dataclass
class Figures:
    """What the rounds measured."""

    ours: list[float] = field(default_factory=list)  # calls/s
    bare: list[float] = field(default_factory=list)
    ours_cpu: dict[str, float] = field(default_factory=dict)  # seconds, summed
    bare_cpu: dict[str, float] = field(default_factory=dict)
    batches: list[tuple[float, float]] = field(default_factory=list)


def measured(cpu: ProcessCpu, into: dict[str, float], work: Callable[[], float]) -> float:
    """`work()`'s result, adding each process's CPU seconds meanwhile to `into`."""
    before = cpu.read()
    seconds = work()
    for name, value in cpu.read().items():
        into[name] = into.get(name, 0.0) + value - before[name]
    return seconds


def run(args: argparse.Namespace, loop: asyncio.AbstractEventLoop, cpu: ProcessCpu) -> Figures:
    """The alternating rounds, then the batches."""
    total = args.sessions * args.calls
    figures = Figures()
    sessions = loop.run_until_complete(
        asyncio.gather(*(open_session(STACK.ws_url) for _ in range(args.sessions)))
    )
    # Warm both sides: imports, connections, the lane's pool, the workers.
    loop.run_until_complete(ours(sessions, 5, "warm"))
    bare(50)
    for r in range(args.rounds):
        spies = profile(args.profile, cpu) if args.profile and r == 0 else []
        tag = f"r{r}"
        seconds = measured(
            cpu,
            figures.ours_cpu,
            lambda: loop.run_until_complete(ours(sessions, args.calls, tag)),  # noqa: B023
        )
        for spy in spies:
            spy.wait()
        figures.ours.append(total / seconds)
        figures.bare.append(total / measured(cpu, figures.bare_cpu, lambda: bare(total)))
        print(
            f"round {r + 1}: ours {figures.ours[-1]:.0f} calls/s, bare Celery "
            f"{figures.bare[-1]:.0f} calls/s: {figures.ours[-1] / figures.bare[-1]:.2f}x",
            flush=True,
        )
    for b in range(args.rounds):
        figures.batches.append(loop.run_until_complete(burst(sessions[0], args.batch, f"batch{b}")))
    for ws in sessions:
        loop.run_until_complete(ws.close())
    return figures


def report(args: argparse.Namespace, figures: Figures) -> None:
    """The figures as Markdown tables."""
    calls_made = args.sessions * args.calls * args.rounds
    ratios = [o / b for o, b in zip(figures.ours, figures.bare, strict=True)]
    print(
        f"\n## Throughput ({args.sessions} sessions x {args.calls} calls in flight, "
        f"{args.rounds} alternating rounds)\n"
    )
    print("| metric | figure |\n|---|---|")
    print(f"| ours, calls/s | {', '.join(f'{x:.0f}' for x in figures.ours)} |")
    print(
        "| bare Celery (noop, 2 prefork), calls/s | "
        f"{', '.join(f'{x:.0f}' for x in figures.bare)} |"
    )
    print(f"| ours / bare, per round (goal >= 0.8x) | {', '.join(f'{x:.2f}x' for x in ratios)} |")
    sent = ", ".join(f"{s * 1000:.0f}" for s, _ in figures.batches)
    answered = ", ".join(f"{a:.2f}" for _, a in figures.batches)
    print(f"| batch of {args.batch} in one session: sent, ms | {sent} |")
    print(f"| batch of {args.batch}: fully answered, s (goal <= 2 s) | {answered} |")
    print("\nCPU per call, ms (user + sys, over every round):\n")
    print("| process | ours | bare |\n|---|---|---|")
    for name, seconds in figures.ours_cpu.items():
        print(
            f"| {name} | {seconds * 1000 / calls_made:.2f} | "
            f"{figures.bare_cpu[name] * 1000 / calls_made:.2f} |"
        )
    ours_total = sum(v for k, v in figures.ours_cpu.items() if k != "bare worker")
    bare_total = sum(figures.bare_cpu[k] for k in ("bare worker", "redis", "client"))
    print(
        f"| **all of its side** | {ours_total * 1000 / calls_made:.2f} | "
        f"{bare_total * 1000 / calls_made:.2f} |"
    )
    print(f"\nmedian ratio: {statistics.median(ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--calls", type=int, default=150, help="calls per session per round")
    parser.add_argument("--batch", type=int, default=1000, help="calls of the one-session batch")
    parser.add_argument("--env", action="append", help="KEY=VALUE for the stack's environment")
    parser.add_argument("--profile", type=Path, help="py-spy the first round into this folder")
    args = parser.parse_args()
    bare_process = bare_worker(STACK.run_dir)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        STACK.start()
        bare_process.start(lambda: " ready." in bare_process.log_text())
        cpu = ProcessCpu(
            {
                "daphne + lane": STACK.web.pid,
                "small worker": STACK.small_worker.pid,
                "heavy worker": STACK.worker.pid,
                "beat": STACK.beat.pid,
                "redis": STACK.redis.pid,
                "bare worker": bare_process.pid,
                "client": os.getpid(),
            },
            alone=("client",),
        )
        figures = run(args, loop, cpu)
    finally:
        loop.close()
        bare_process.stop()
        STACK.stop()
        STACK.remove_files()
    report(args, figures)


if __name__ == "__main__":
    main()
