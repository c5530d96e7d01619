"""The admin's Workers page: live workers from real announcements in the stack's Redis."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from capabilities.admin.workers import Overview, QueueRow
from capabilities.conf import abp_settings
from capabilities.jobs import workers
from capabilities.models import AgentSession, Job, JobStatus
from capabilities.work import registry
from tests.support.admin_clients import client_for
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

PAGE = reverse("admin:capabilities_job_workers")


@pytest.fixture
def staff() -> Client:
    return client_for(staff=True)


@pytest.fixture
def own_workers(stack: Stack) -> Iterator[None]:
    """Announcements under this test's own prefix: the stack's real workers stay out."""
    prefix = f"abp:test-workers:{uuid.uuid4().hex}:"
    with override_settings(ABP={**settings.ABP, "WORKER_KEY_PREFIX": prefix}):
        yield
        for worker in workers.live_workers():
            workers.withdraw(worker.hostname)


def live_worker(
    queues: tuple[str, ...], *, jobs: tuple[str, ...] = (), age: float = 0.0
) -> workers.LiveWorker:
    return workers.LiveWorker(
        hostname=f"w-{uuid.uuid4().hex[:8]}@test",
        queues=queues,
        concurrency=3,
        jobs=jobs,
        pid=4242,
        announced_at=time.time() - age,
    )


def workers_page(client: Client) -> tuple[str, Overview]:
    """The page's HTML and the overview it was rendered from."""
    page = client.get(PAGE)
    assert page.status_code == 200
    assert page.context_data is not None  # a TemplateResponse
    overview = page.context_data["overview"]
    assert isinstance(overview, Overview)
    return page.content.decode(), overview


def queue_row(overview: Overview, name: str) -> QueueRow:
    return next(row for row in overview.queues if row.name == name)


def job_in(session: AgentSession, queue: str, status: JobStatus, *, dispatched: bool) -> Job:
    return Job.objects.create(
        session=session,
        call_id=f"call-{uuid.uuid4().hex[:8]}",
        capability="process.image",
        queue=queue,
        status=status,
        dispatched_at=timezone.now() if dispatched else None,
    )


@pytest.mark.usefixtures("own_workers")
def test_a_live_worker_shows_its_queues_concurrency_jobs_and_heartbeat(staff: Client) -> None:
    queue = f"abp.test-{uuid.uuid4().hex[:8]}"
    session = AgentSession.objects.create(agent_name="workers-page")
    running = job_in(session, queue, JobStatus.RUNNING, dispatched=True)
    job_in(session, queue, JobStatus.QUEUED, dispatched=False)
    job_in(session, queue, JobStatus.QUEUED, dispatched=False)
    job_in(session, queue, JobStatus.SUCCEEDED, dispatched=True)  # neither: settled
    worker = live_worker((queue,), jobs=(str(running.id),), age=4.0)
    workers.announce(worker)
    with override_settings(ABP={**settings.ABP, "CAPABILITY_QUEUES": {"process.image": queue}}):
        html, overview = workers_page(staff)
    assert worker.hostname in html
    assert f"<code>{queue}</code>" in html
    assert "1 busy of 3" in html
    assert reverse("admin:capabilities_job_change", args=[running.pk]) in html
    assert running.call_id in html
    assert "<code>process.image</code> running" in html
    assert re.search(r"4\.\d s ago", html)
    [shown] = overview.workers or ()
    assert 4.0 <= shown.worker.heartbeat_age < 10.0
    row = queue_row(overview, queue)
    assert (row.capabilities, row.slots, row.waiting, row.dispatched) == (
        ("process.image",),
        3,
        2,
        1,
    )
    # The other queues have no worker here: their capabilities are named unavailable.
    assert queue_row(overview, abp_settings().QUEUES.heavy).slots == 0
    assert "export.pdf" in overview.unavailable
    assert "process.image" not in overview.unavailable
    assert 'id="unavailable"' in html


@pytest.mark.usefixtures("own_workers")
def test_withdrawn_and_expired_workers_are_not_shown(staff: Client) -> None:
    kept, withdrawn, expiring = (live_worker(("abp.heavy",)) for _ in range(3))
    workers.announce(kept)
    workers.announce(withdrawn)
    workers.withdraw(withdrawn.hostname)
    with override_settings(ABP={**settings.ABP, "WORKER_TTL_SECONDS": 1.0}):
        workers.announce(expiring)
    assert expiring.hostname in workers_page(staff)[0]

    def once_expired() -> str | None:
        html = workers_page(staff)[0]
        return None if expiring.hostname in html else html

    html = eventually(once_expired, timeout=5.0)
    assert kept.hostname in html
    assert withdrawn.hostname not in html


@pytest.mark.usefixtures("own_workers")
def test_with_no_worker_alive_the_page_says_so_and_names_what_is_unavailable(
    staff: Client,
) -> None:
    html, overview = workers_page(staff)
    assert "No worker is alive" in html
    assert 'id="workers"' not in html
    notice = html[html.index('id="no-workers"') : html.index("</p>", html.index('id="no-workers"'))]
    for spec in registry.all_specs():
        assert f"<code>{spec.name}</code>" in notice
    assert all(row.slots == 0 for row in overview.queues)


def test_without_redis_the_page_says_workers_are_unknown(
    staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable() -> list[workers.LiveWorker]:
        raise redis.ConnectionError("refused")

    monkeypatch.setattr(workers, "live_workers", unreachable)
    html, overview = workers_page(staff)
    assert "Redis did not answer (ConnectionError)" in html
    assert "No worker is alive" not in html
    assert all(row.slots is None for row in overview.queues)


def test_the_page_has_a_stable_url_linked_from_the_jobs_changelist(staff: Client) -> None:
    assert PAGE == "/admin/capabilities/job/workers/"
    changelist = staff.get(reverse("admin:capabilities_job_changelist"))
    assert f'<a href="{PAGE}">Workers</a>' in changelist.content.decode()


@pytest.mark.parametrize("client", ["anonymous", "not staff"])
def test_only_staff_see_the_page(client: str) -> None:
    visitor = Client(HTTP_HOST="127.0.0.1") if client == "anonymous" else client_for(staff=False)
    page = visitor.get(PAGE)
    assert page.status_code == 302
    assert page["Location"] == f"{reverse('admin:login')}?next={PAGE}"
