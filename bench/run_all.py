"""Run the benchmarks in turn (`make bench`); each prints its own figures.

First `side_by_side.py` (issue 17's table, each figure against its baseline), then the
others with their defaults. `--quick`: the side-by-side table alone, with fewer rounds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "side_by_side.py",
    "throughput.py",
    "batched_writes.py",
    "cold_start.py",
    "mcp_call.py",
    "capacity.py",
    "channel_layers.py",
    "cancel_latency.py",
    "capabilities_speed.py",
    "admin_changelist.py",
    "auth_overhead.py",
    "load_sessions.py",
    "python_client.py",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="only side_by_side.py, with fewer rounds"
    )
    args = parser.parse_args()
    runs = [["side_by_side.py", "--quick"]] if args.quick else [[name] for name in BENCHMARKS]
    failed = 0
    for name, *options in runs:
        print(f"\n######## {name}", flush=True)
        command = [sys.executable, str(HERE / name), *options]
        failed += subprocess.run(command, check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
