"""A soak from start to end: the stack up, the fault schedule printed, the soak, the
stack down, the report printed (and written as JSON)."""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from tests.support import postgres_server
from tests.support.soak import report
from tests.support.soak.faults import schedule
from tests.support.soak.run import Options, Outcome, soak
from tests.support.soak.stack import SoakStack


def run_soak(options: Options, *, report_path: Path | None, logs: Path | None) -> Outcome:
    """Start the stack, soak it, stop it; the outcome (the report is printed as it goes)."""
    unavailable = postgres_server.available()
    if unavailable:
        raise RuntimeError(f"soak: {unavailable}")
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
