"""Run every benchmark in turn (`make bench`); each prints its own figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "channel_layers.py",
    "cancel_latency.py",
    "capabilities_speed.py",
    "admin_changelist.py",
    "auth_overhead.py",
    "load_sessions.py",
)


def main() -> int:
    failed = 0
    for name in BENCHMARKS:
        print(f"\n######## {name}", flush=True)
        failed += (
            subprocess.run(
                [sys.executable, str(HERE / name), *sys.argv[1:]], check=False
            ).returncode
            != 0
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
