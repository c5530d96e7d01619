"""Where the samples of a py-spy profile went: per process, and per function of ours.

Reads py-spy's collapsed stacks (`--format raw`, as `bench/throughput.py --profile`
writes them) and prints each process's share of the samples, then, for the main
process alone (threads included, children not), the share of each part of a call
and the functions under `capabilities/` that the most samples passed through.

Run: .venv/bin/python bench/profile_summary.py FILE [--top 30]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# The first pattern a main-process stack contains names its part (order matters).
PARTS = (
    ("database: slot counts", "slot_counts ("),
    ("database: insert", "row_inserts.py"),
    ("database: settle", "settle ("),
    ("database: delivery claim", "claim_delivery"),
    ("database: dispatch (pump)", "dispatch.py"),
    ("database: other", "DatabaseSyncToAsync"),
    ("lane: result handler thread", "ResultHandler"),
    ("lane: task handler thread", "TaskHandler"),
    ("lane: other pool threads", "billiard/pool.py"),
    ("lane: run bookkeeping", "lane_runs.py"),
    ("rate limiter", "rate_limits.py"),
    ("Celery publish", "send_task"),
    ("channel layer", "channels_redis"),
    ("event loop: frames, sessions, sends", "_run_once"),
)


def _frame(name: str) -> str:
    name = re.sub(r" \(/.*?site-packages/", " (", name)
    name = re.sub(r" \(/.*?/capabilities/", " (capabilities/", name)
    return re.sub(r":\d+\)$", ")", name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    processes: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = main_total = 0
    for line in args.file.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        n = int(count)
        frames = stack.split(";")
        total += n
        children = [f for f in frames[1:] if f.startswith("process ")]
        processes[(children[-1] if children else frames[0])[:70]] += n
        if children:
            continue
        main_total += n
        part = next((name for name, pattern in PARTS if pattern in stack), "other")
        parts[part] += n
        for name in {_frame(f) for f in frames[1:] if "(capabilities/" in _frame(f)}:
            ours[name] += n
    print(f"{total} samples\n\nper process:")
    for name, n in processes.most_common():
        print(f"  {n / total * 100:5.1f}%  {name}")
    print(f"\nthe main process ({main_total} samples), by part:")
    for name, n in parts.most_common():
        print(f"  {n / main_total * 100:5.1f}%  {name}")
    print("\nthe main process, through our functions (inclusive):")
    for name, n in ours.most_common(args.top):
        print(f"  {n / main_total * 100:5.1f}%  {name}")


if __name__ == "__main__":
    main()
