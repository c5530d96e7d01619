"""The soak harness (`make soak`): the production-like stack under mixed, continuous load
on every door while faults are injected at random moments drawn from a seed.

The stack: a private PostgreSQL 15 cluster, a private Redis, two Daphnes behind HAProxy
(deploy/haproxy.cfg), heavy and small workers on two nodes, beat, each started with
`scripts/serve ROLE`; the Daphnes reach Redis through a relay that can stall. The load:
ABP WebSocket agents, JSON-RPC sessions, MCP clients on both wires, the Python client
and a headless browser page through the embed bridge, with cancels at random moments,
server timeouts, dropped sockets that resume and revoked keys. The faults, their
schedule printed first, and the invariants: tests/support/soak/ and docs/reliability.md.

Run: .venv/bin/python bench/soak.py [--minutes 60] [--seed 1] [--report soak.json]
Exits 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import postgres_server
from tests.support.soak import report
from tests.support.soak.faults import schedule
from tests.support.soak.run import Options, Outcome, soak
from tests.support.soak.stack import SoakStack


def run(options: Options, *, report_path: Path | None, logs: Path | None) -> Outcome:
    """Start the stack, soak it, stop it; the outcome (the report is printed as it goes)."""
    unavailable = postgres_server.available()
    if unavailable:
        raise SystemExit(f"soak: {unavailable}")
    with tempfile.TemporaryDirectory(prefix="abp-soak-") as run_dir:
        stack = SoakStack(Path(run_dir))
        load_seconds = options.minutes * 60
        faults = schedule(
            random.Random(options.seed), stack, start=options.warmup,
            end=max(options.warmup + 1, load_seconds - options.quiet),
            per_minute=options.faults_per_minute,
        )  # fmt: skip
        print(f"== fault schedule (seed {options.seed}): {len(faults)} faults", flush=True)
        print("\n".join(report.schedule_lines(faults)), flush=True)
        try:
            started = time.monotonic()
            stack.start()
            print(
                f"== stack up in {time.monotonic() - started:.0f} s: {stack.http_url};"
                f" load for {options.minutes} min",
                flush=True,
            )
            outcome = asyncio.run(soak(stack, options, faults))
        finally:
            stack.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                stack.keep_logs(logs)
    print("\n".join(report.text(outcome.report)), flush=True)
    if report_path is not None:
        report_path.write_text(json.dumps(outcome.report, indent=2, default=str))
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    defaults = Options()
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="of load")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--report", type=Path, help="also write the report here, as JSON")
    parser.add_argument("--logs", type=Path, help="keep every process's log in this folder")
    parser.add_argument("--ops", action="store_true", help="every call in the JSON report")
    parser.add_argument("--no-browser", action="store_true", help="leave the browser door out")
    parser.add_argument("--faults-per-minute", type=float, default=defaults.faults_per_minute)
    args = parser.parse_args()
    # Stopped from outside (timeout, Ctrl-C): still stop the stack and its cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = Options(
        minutes=args.minutes,
        seed=args.seed,
        browser=not args.no_browser,
        keep_ops=args.ops,
        faults_per_minute=args.faults_per_minute,
        command=shlex.join(["bench/soak.py", *sys.argv[1:]]),
    )
    outcome = run(options, report_path=args.report, logs=args.logs)
    sys.exit(1 if outcome.violations or outcome.report["harness_errors"] else 0)


if __name__ == "__main__":
    main()
