"""The soak harness (`make soak`): the production-like stack under mixed, continuous load
on every door while faults are injected at random moments drawn from a seed.

The stack: a private PostgreSQL 15 cluster, a private Redis, two Daphnes behind HAProxy
(deploy/haproxy.cfg), heavy and small workers on two nodes, beat, each started with
`scripts/serve ROLE`; the Daphnes reach Redis through a relay that can stall or refuse.
The load: ABP WebSocket agents, JSON-RPC sessions, MCP clients on both wires, the
Python client and a headless browser page through the embed bridge, with cancels at
random moments, server timeouts, dropped sockets that resume and revoked keys. The
faults (most at random moments, two aimed at a moment of the load), their schedule
printed first, and the invariants: tests/support/soak/ and docs/reliability.md.

Run: .venv/bin/python bench/soak.py [--minutes 60] [--seed 1] [--report soak.json]
Exits 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.soak.load import Sizes
from tests.support.soak.main import run_soak
from tests.support.soak.run import Options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    defaults = Options()
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="of load")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--report", type=Path, help="also write the report here, as JSON")
    parser.add_argument("--logs", type=Path, help="keep every process's log in this folder")
    parser.add_argument("--ops", action="store_true", help="every call in the JSON report")
    parser.add_argument("--no-browser", action="store_true", help="leave the browser door out")
    parser.add_argument(
        "--faults-per-minute", type=float, default=defaults.faults_per_minute, help="0: none"
    )
    args = parser.parse_args()
    # Stopped from outside (timeout, Ctrl-C): still stop the stack and its cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = Options(
        minutes=args.minutes,
        seed=args.seed,
        sizes=Sizes(browser=not args.no_browser),
        keep_ops=args.ops,
        faults_per_minute=args.faults_per_minute,
        command=shlex.join(["bench/soak.py", *sys.argv[1:]]),
    )
    outcome = run_soak(options, report_path=args.report, logs=args.logs)
    sys.exit(1 if outcome.violations or outcome.report["harness_errors"] else 0)


if __name__ == "__main__":
    main()
