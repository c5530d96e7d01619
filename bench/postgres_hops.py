"""The database settings on PostgreSQL: a small call and a cancel, variant against variant.

Each variant (a DATABASES setting) gets a stack of its own (Redis, both Celery workers,
beat, Daphne) and a PostgreSQL database of its own on TEST_DATABASE_URL's server
(default postgres@127.0.0.1:5432), all started at once; one client (tests/support/agent.py)
then takes turns, iteration by iteration, in a rotating order, so that every variant
sees the same machine. It times, per variant:
- `--iterations` `convert.markdownToHtml` calls -> their call-result; then
- as many cancels of a running `test.sleep` (checkpoints every 5 ms), 0 to 100 ms
  after its first progress -> cancel-result, and -> the cancelled call-result.
Each row also gives the median of the per-iteration differences to the first variant.

Variants: `before` is the setting this replaced (persistent connections, Django's
health check on every `database_sync_to_async` call), `after` the settings as shipped
(connections replaced after 60 s, no health check); `age` is the same as `after`,
`no-checks` keeps connections forever, `pool` and `pool-checks` use Django's psycopg
pool, and `async-commit` adds `synchronous_commit=off` (not shipped: a crash may lose
the last commits). `sqlite` is the default SQLite database instead: `--variants
sqlite,after` gives PostgreSQL's figures against SQLite's.

Run: .venv/bin/python bench/postgres_hops.py [--iterations 300] [--variants before,after]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment
from tests.support.stack import Stack, free_port

ROOT = Path(__file__).resolve().parent.parent

# What each variant sets on top of tests.settings' DATABASES["default"].
VARIANTS: dict[str, dict[str, Any]] = {
    "before": {"CONN_MAX_AGE": None, "CONN_HEALTH_CHECKS": True, "OPTIONS": {}},
    "after": {},
    # Not PostgreSQL: the default SQLite database, as shipped, for the ratio of the two.
    "sqlite": {},
    "no-checks": {"CONN_MAX_AGE": None, "CONN_HEALTH_CHECKS": False, "OPTIONS": {}},
    "age": {"CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": False, "OPTIONS": {}},
    "async-commit": {
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": False,
        "OPTIONS": {"options": "-c synchronous_commit=off"},
    },
    "pool": {
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "OPTIONS": {"pool": {"min_size": 1, "max_size": 8}},
    },
    "pool-checks": {
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {"pool": {"min_size": 1, "max_size": 8}},
    },
}
MARKDOWN = {"markdown": "# Title\n\nSome *text*."}
SLEEP = {"steps": 2000, "stepMs": 5}


@dataclass
class Times:
    """One variant's measurements, in ms."""

    small_call: list[float] = field(default_factory=list)
    cancel_result: list[float] = field(default_factory=list)
    cancelled_call_result: list[float] = field(default_factory=list)


@dataclass
class Variant:
    """A stack of the variant's own, the environment it starts with, its agent key."""

    stack: Stack
    env: dict[str, str]
    key: str

    def start(self) -> None:
        """Start the stack, its processes with the variant's environment."""
        # The stack's processes take this process's environment as they start.
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            self.stack.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)


def variant_stack(name: str, database_url: str) -> Variant:
    """A stack on `database_url` with the variant's settings, migrated, with a key."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"abp-bench-hops-{name}-"))
    module = f"hops_{name.replace('-', '_')}"
    (run_dir / f"{module}.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "from tests.settings import DATABASES\n\n"
        f"DATABASES['default'].update({VARIANTS[name]!r})\n"
    )
    stack = Stack(run_dir, free_port())
    env = {
        "DJANGO_SETTINGS_MODULE": module,
        "PYTHONPATH": os.pathsep.join([str(run_dir), str(ROOT)]),
        "DATABASE_URL": database_url,
        "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}/0",
    }
    manage = {**os.environ, **env}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=manage, check=True
    )
    key = subprocess.run(
        [sys.executable, "manage.py", "create_agent_key", f"bench {name}", "--quiet"],
        cwd=ROOT,
        env=manage,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Variant(stack, env, key)


def small_call(agent: Any) -> float:
    start = time.perf_counter()
    result = agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN))
    elapsed = (time.perf_counter() - start) * 1000
    assert result["payload"]["success"] is True, result
    return elapsed


def cancel(agent: Any, number: int, pause: float) -> tuple[float, float]:
    """Cancel a running test.sleep `pause` s after its first progress.

    Returns (-> cancel-result, -> call-result), in ms.
    """
    call_id = f"sleep-{number}"
    call = agent.call("test.sleep", SLEEP, call_id=call_id, progress_token=call_id)
    # The first progress of the work itself (a queued call's progress says "queued").
    agent.wait_for(
        lambda e: (
            e["type"] == "progress"
            and e["payload"].get("operationId") == call_id
            and e["payload"].get("stage") == "sleeping"
        )
    )
    # Somewhere in the work, as bench/cancel_latency.py does.
    time.sleep(pause)
    start = time.perf_counter()
    agent.reply_to(agent.cancel(call_id), "capabilities/cancel-result")
    confirmed = (time.perf_counter() - start) * 1000
    result = agent.result_of(call)
    answered = (time.perf_counter() - start) * 1000
    assert result["payload"].get("cancelled") is True, result
    agent.inbox.clear()
    return confirmed, answered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--variants", default="before,after")
    args = parser.parse_args()
    names = args.variants.split(",")
    rng = random.Random(1)
    unknown = set(names) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}; known: {sorted(VARIANTS)}")
    os.environ["ABP_TEST_DATABASE"] = "postgres"
    databases = {name: environment.PostgresDatabase() for name in names if name != "sqlite"}
    urls = {name: database.url for name, database in databases.items()}
    if "sqlite" in names:
        urls["sqlite"] = f"sqlite:///{tempfile.mkdtemp(prefix='abp-bench-hops-sqlite-')}/db.sqlite3"
    # This process only drives WebSockets; Django is set up for the stacks' environment.
    unused = environment.configure("abp-bench-hops-", DATABASE_URL=urls[names[0]])
    unused.remove_files()
    from bench import stats
    from tests.support.agent import Agent

    variants = {name: variant_stack(name, urls[name]) for name in names}
    times = {name: Times() for name in names}
    agents: dict[str, Agent] = {}
    try:
        for variant in variants.values():
            variant.start()
        for name, variant in variants.items():
            agents[name] = Agent(variant.stack.ws_url, key=variant.key)
            agents[name].initialize()
            for number in range(10):  # warm up workers and connections
                small_call(agents[name])
                cancel(agents[name], -number - 1, 0.0)
        # Small calls first, then cancels: what a cancel leaves behind (the revoke
        # broadcast every worker handles) would slow the small call after it. Within
        # each, a rotating order: no variant always goes first.
        for number in range(args.iterations):
            for name in rotated(names, number):
                times[name].small_call.append(small_call(agents[name]))
        for number in range(args.iterations):
            pause = rng.uniform(0, 0.1)
            for name in rotated(names, number):
                confirmed, answered = cancel(agents[name], number, pause)
                times[name].cancel_result.append(confirmed)
                times[name].cancelled_call_result.append(answered)
    finally:
        for agent in agents.values():
            agent.close()
        for variant in variants.values():
            variant.stack.stop()
            variant.stack.remove_files()
        for database in databases.values():
            database.drop()
        environment.remove_database()

    baseline = names[0]
    rows = (
        ("convert.markdownToHtml call -> call-result", "small_call"),
        ("cancel of a running test.sleep -> cancel-result", "cancel_result"),
        ("cancel -> cancelled call-result", "cancelled_call_result"),
    )
    for title, attribute in rows:
        print(f"\n== {title} ({args.iterations} each, alternating)")
        base = getattr(times[baseline], attribute)
        base_p50 = stats.summary(base)["p50"]
        for name in names:
            values = getattr(times[name], attribute)
            print(stats.line(name, values, None if name == baseline else base_p50))
        for name in names[1:]:
            print(paired(name, baseline, getattr(times[name], attribute), base))


def rotated(names: list[str], number: int) -> list[str]:
    """`names`, starting at the `number`th."""
    start = number % len(names)
    return names[start:] + names[:start]


def paired(name: str, baseline: str, values: list[float], base: list[float]) -> str:
    """The median of the per-iteration differences, and how often `name` was faster.

    Measured in the same iteration, both sides saw the same moment of the machine:
    the differences carry less of its drift than the two medians do.
    """
    differences = [value - before for value, before in zip(values, base, strict=True)]
    faster = sum(difference < 0 for difference in differences) / len(differences)
    return (
        f"   {name} - {baseline}, same iteration: median {statistics.median(differences):+.3f} ms,"
        f" {name} faster in {faster:.0%}"
    )


if __name__ == "__main__":
    main()
