"""Several nodes on one box: two Daphnes, workers for each queue on two nodes, one beat.

Starts the deployment's processes with the deployment's own commands (`scripts/serve
ROLE`, read from docker-compose.yml; tests/support/topology.py) on a PostgreSQL
database of its own (TEST_DATABASE_URL's server, default postgres@127.0.0.1:5432) and
a private Redis: Daphnes on two ports, `heavy@node1`, `small@node1`, `heavy@node2`,
`small@node2` and one beat. Then (tests/support/fleet.py):

1. opens `--sessions` sessions spread over both Daphnes and leaves them idle: each
   Daphne's RSS and PSS before and after, per idle session;
2. sends `--burst` markdown calls at once over the sessions and waits for every answer:
   the answer rate at capacity, both Daphnes up;
3. sends `--calls` calls over the sessions at random moments of `--window` s, mostly
   convert.markdownToHtml and `--long-share` of long test.sleep, with random cancels;
4. kills the second Daphne by PID (SIGKILL) mid-load: its sessions resume on the
   first (initialize.resume), and send again what they had not heard back about;
5. kills heavy@node2's main process by PID (SIGKILL) once a job runs on it: its jobs
   answer WORKER_LOST, everything else goes on on node1;
6. checks that every call got exactly one call-result across each session's
   connections, consistent with its job row and its cancels, and prints the memory
   per idle session, the answer rates and the counts.

Run: .venv/bin/python bench/multi_node.py [--sessions 1000] [--calls 400] [--burst 1000]
     (tests/stack/test_multi_node.py runs the same scenario, smaller, as a test)
Exits 1 if a check failed. `--json FILE` also writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import fleet, postgres
from tests.support.topology import Topology


def raise_open_file_limit(sessions: int) -> None:
    """Room for a socket per session here and in each Daphne (they inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * sessions + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    defaults = fleet.Options()
    parser.add_argument("--sessions", type=int, default=defaults.sessions)
    parser.add_argument("--calls", type=int, default=defaults.calls, help="over all sessions")
    parser.add_argument("--window", type=float, default=defaults.window)
    parser.add_argument(
        "--burst", type=int, default=1000, help="markdown calls at once first (0: none)"
    )
    parser.add_argument("--long-share", type=float, default=defaults.long_share)
    parser.add_argument("--heavy-concurrency", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the logs (var/test-artifacts)")
    args = parser.parse_args()
    unreachable = postgres.reachable()
    if unreachable:
        raise SystemExit(unreachable)
    raise_open_file_limit(args.sessions)
    # Stopped from outside (timeout, Ctrl-C): still stop the stack and drop the database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = fleet.Options(
        sessions=args.sessions,
        calls=args.calls,
        burst=args.burst,
        window=args.window,
        long_share=args.long_share,
        idle_seconds=args.idle_seconds,
        seed=args.seed,
        kill_web_at=args.window * 0.3,
        kill_worker_at=args.window * 0.45,
    )
    run_dir = Path(tempfile.mkdtemp(prefix="abp-bench-multi-node-"))
    topology = Topology(
        "bench_multinode", run_dir, fleet.SETTINGS, heavy_concurrency=args.heavy_concurrency
    )
    artifacts = Path(__file__).resolve().parent.parent / "var" / "test-artifacts" / "multi-node"
    with topology.running(artifacts if args.keep else None):
        key = topology.create_key("multi-node bench")
        print(f"  stack up: {', '.join(p.name for p in topology.processes)}", flush=True)
        outcome = asyncio.run(fleet.run_scenario(topology, key, options))
    print("\n".join(fleet.report_lines(outcome)))
    if args.json:
        args.json.write_text(json.dumps(outcome.figures, indent=2))
    raise SystemExit(1 if outcome.problems else 0)


if __name__ == "__main__":
    main()
