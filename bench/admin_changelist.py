"""The jobs changelist with 100,000 jobs: time and queries per page.

Run: .venv/bin/python bench/admin_changelist.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-admin-")

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from capabilities.models import AgentSession, CancelSource, Job, JobStatus  # noqa: E402


def populate(count: int) -> str:
    rng = random.Random(7)
    sessions = [AgentSession(agent_name=f"agent-{n}") for n in range(200)]
    AgentSession.objects.bulk_create(sessions)
    now = timezone.now()
    batch = []
    sample_call = ""
    for _ in range(count):
        status = rng.choice(JobStatus.values)
        created = now - timedelta(seconds=rng.randint(0, 7 * 86400))
        job = Job(
            session=rng.choice(sessions),
            call_id=str(uuid.UUID(int=rng.getrandbits(128))),
            capability=rng.choice(["export.pdf", "process.image", "convert.markdownToHtml"]),
            params={"html": "<p>x</p>"},
            status=status,
            cancel_source=CancelSource.AGENT if status == JobStatus.CANCELLED else "",
            created_at=created,
            started_at=created + timedelta(seconds=1),
            stopped_at=created + timedelta(seconds=3) if status != JobStatus.RUNNING else None,
        )
        sample_call = job.call_id
        batch.append(job)
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)
    return sample_call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    try:
        call_id = populate(args.jobs)
        user = get_user_model().objects.create_superuser(username="b", email="", password="b")
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        url = reverse("admin:capabilities_job_changelist")
        pages = {
            "newest first": {},
            "status=running": {"status__exact": "running"},
            "capability + cancel source": {
                "capability": "process.image",
                "cancel_source__exact": "agent",
            },
            "search by callId": {"q": call_id},
            "page 50": {"p": "50"},
        }
        print(f"\n== jobs changelist with {Job.objects.count()} jobs (SQLite)")
        for label, query in pages.items():
            client.get(url, query)
            times = []
            for _ in range(5):
                with CaptureQueriesContext(connection) as captured:
                    start = time.perf_counter()
                    assert client.get(url, query).status_code == 200
                    times.append((time.perf_counter() - start) * 1000)
            print(f"{label:<30} median {statistics.median(times):7.1f} ms, {len(captured)} queries")
    finally:
        STACK.remove_files()


if __name__ == "__main__":
    main()
