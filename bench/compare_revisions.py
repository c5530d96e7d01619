"""Cancel latency and the small call, this tree against an earlier revision, interleaved.

Checks the earlier revision out into a temporary git worktree, then runs
bench/cancel_latency.py from each tree in turn (before, after, before, after, ...),
back to back with the same interpreter, and prints each row's p50 and the ratio
after/before of the medians over the rounds. Both sides drive their stack with the
same client (tests/support/agent.py).

Run: .venv/bin/python bench/compare_revisions.py --before <rev> [--rounds 2] [--cancels 100]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^(?P<label>\S.*?)\s+n=\d+\s+p50=\s*(?P<p50>[\d.]+) ms")


def run_once(tree: Path, cancels: int, round_trips: int) -> dict[str, float]:
    """One cancel_latency run from `tree`: p50 (ms) by row, rows named by section."""
    script = ROOT / "bench" / "cancel_latency.py"
    if tree != ROOT:
        shutil.copy(script, tree / "bench" / "cancel_latency.py")
    output = subprocess.run(
        [
            sys.executable,
            str(tree / "bench" / "cancel_latency.py"),
            "--cancels",
            str(cancels),
            "--round-trips",
            str(round_trips),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows: dict[str, float] = {}
    section = ""
    for line in output.splitlines():
        if line.startswith("== "):
            section = line[3:]
        elif match := ROW.match(line):
            rows[f"{section} / {match['label']}"] = float(match["p50"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="the earlier revision")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--round-trips", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abp-before-") as scratch:
        before = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(before), args.before],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for number in range(args.rounds):
                for side, tree in (("before", before), ("after", ROOT)):
                    print(f"round {number + 1}: {side}", flush=True)
                    runs[side].append(run_once(tree, args.cancels, args.round_trips))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False
            )
    rows = [
        row for row in runs["after"][0] if all(row in run for run in runs["before"] + runs["after"])
    ]
    print(f"\n{'p50, median over rounds':<90} {'before':>9} {'after':>9} {'ratio':>6}")
    for row in rows:
        old = statistics.median(run[row] for run in runs["before"])
        new = statistics.median(run[row] for run in runs["after"])
        print(f"{row[:90]:<90} {old:7.2f}ms {new:7.2f}ms {new / old:6.2f}")
    # The machine's speed drifts between runs: each row over its own run's baseline
    # (the first row of its section: a frame's round trip, or a bare Celery call)
    # cancels that drift out.
    title = "p50 over its section's baseline, median over rounds"
    print(f"\n{title:<90} {'before':>9} {'after':>9} {'ratio':>6}")
    for row in rows:
        section = row.split(" / ")[0]
        baseline = next(r for r in rows if r.startswith(section + " / "))
        if row == baseline:
            continue
        old = statistics.median(run[row] / run[baseline] for run in runs["before"])
        new = statistics.median(run[row] / run[baseline] for run in runs["after"])
        print(f"{row[:90]:<90} {old:8.2f}x {new:8.2f}x {new / old:6.2f}")


if __name__ == "__main__":
    main()
