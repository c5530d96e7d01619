"""What one /metrics scrape costs, with many jobs in the database.

Starts Redis and one Daphne (no worker), stores `--jobs` jobs (`--window` of them settled
within the metrics window, the rest settled days ago, and `--active` queued or running),
then times GET /metrics over HTTP and the database part of a scrape in-process, and
/readyz and /healthz for comparison.
`--drop-index` first drops job_settled_idx, to see what the index is for.

Run: .venv/bin/python bench/metrics_scrape.py [--jobs 10000] [--window 10000] [--active 200]
     [--drop-index]; with ABP_TEST_DATABASE=postgres, on a fresh PostgreSQL database.
"""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import time
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment
from tests.support.stack import port_open

TOKEN = secrets.token_urlsafe(32)
STACK = environment.prepare("abp-bench-metrics-", ABP_METRICS_TOKEN=TOKEN)

from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.stats import line  # noqa: E402
from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus  # noqa: E402
from capabilities.web.metrics_collector import ClusterCollector  # noqa: E402

CAPABILITIES = {
    "export.pdf": "abp.heavy",
    "process.image": "abp.heavy",
    "convert.markdownToHtml": "abp.small",
}


def populate(total: int, window: int, active: int) -> None:
    rng = random.Random(7)
    sessions = [
        AgentSession(agent_name=f"agent-{n}", door=rng.choice(Door.values)) for n in range(200)
    ]
    AgentSession.objects.bulk_create(sessions)
    now = timezone.now()
    batch: list[Job] = []
    for n in range(total + active):
        capability = rng.choice(list(CAPABILITIES))
        if n < active:
            status = rng.choice([JobStatus.QUEUED, JobStatus.RUNNING])
            settled_ago = None
        else:
            status = rng.choice([JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
            in_window = n - active < window
            settled_ago = rng.uniform(1, 290) if in_window else rng.uniform(86400, 7 * 86400)
        run = rng.uniform(0.01, 20)
        wait = rng.uniform(0.001, 5)
        settled = now - timedelta(seconds=settled_ago) if settled_ago is not None else None
        started = (settled or now) - timedelta(seconds=run)
        created = started - timedelta(seconds=wait)
        cancelled = status == JobStatus.CANCELLED
        batch.append(
            Job(
                session=rng.choice(sessions),
                call_id=str(uuid.UUID(int=rng.getrandbits(128))),
                capability=capability,
                queue=CAPABILITIES[capability],
                params={"markdown": "# x"},
                principal=f"key:{rng.randrange(50):08x}",
                status=status,
                error_code="CANCELLED" if cancelled else "",
                cancel_source=CancelSource.AGENT if cancelled else "",
                created_at=created,
                dispatched_at=created if status != JobStatus.QUEUED else None,
                started_at=started if status != JobStatus.QUEUED else None,
                settled_at=settled,
                stopped_at=(settled + timedelta(seconds=rng.uniform(0, 0.2))) if settled else None,
            )
        )
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)


def scrape(url: str) -> float:
    """Milliseconds of one GET (with the metrics token)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        response.read()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--drop-index", action="store_true")
    args = parser.parse_args()
    try:
        populate(args.jobs, min(args.window, args.jobs), args.active)
        if args.drop_index:
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX job_settled_idx")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # fresh statistics, as after any autovacuum
        STACK.redis.start(lambda: port_open(STACK.redis_port))
        STACK.web.start(lambda: port_open(STACK.web_port))
        url = f"{STACK.http_url}/metrics"
        for _ in range(3):
            scrape(url)
        over_http = [scrape(url) for _ in range(args.runs)]
        database = []
        for _ in range(args.runs):
            reading = ClusterCollector().read()
            database.append(reading.seconds["database"] * 1000)
        index = "without job_settled_idx" if args.drop_index else "with job_settled_idx"
        print(
            f"\n== /metrics, {Job.objects.count()} jobs ({args.window} settled in the window,"
            f" {args.active} active), {connection.vendor}, {index}"
        )
        print(line("GET /metrics over HTTP", over_http))
        print(line("its database part (3 statements), in-process", database))
        # No worker here: readiness without that check (the database and Redis).
        ready = [scrape(f"{STACK.http_url}/readyz?exclude=workers") for _ in range(args.runs)]
        print(line("GET /readyz?exclude=workers over HTTP", ready))
        print(
            line(
                "GET /healthz over HTTP",
                [scrape(f"{STACK.http_url}/healthz") for _ in range(args.runs)],
            )
        )
    finally:
        STACK.web.stop()
        STACK.redis.stop()
        STACK.remove_files()
        environment.remove_database()


if __name__ == "__main__":
    main()
