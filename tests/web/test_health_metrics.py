"""Health, readiness, /metrics and job-event logs.

/healthz and /readyz over HTTP on the real stack, and on Daphnes whose Redis is gone or
that see no live worker; /metrics refused by default, behind its token and address
list, its numbers read back against jobs with known times; one log record per job
event with the job's fields, in-process and as JSON lines from a Daphne.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings
from django.utils import timezone
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pythonjsonlogger.json import JsonFormatter

from abpsite.log_formats import PlainFormatter
from capabilities.calls import draining
from capabilities.endings import cancellation
from capabilities.jobs import dispatch, lifecycle
from capabilities.jobs.workers import LiveWorker
from capabilities.lane import lane as local_lane
from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus
from capabilities.web import cluster_state, health
from capabilities.web.metrics_collector import ClusterCollector
from tests.support.agent import Agent
from tests.support.stack import ROOT, Stack, free_port
from tests.support.waiting import eventually

TOKEN = secrets.token_urlsafe(32)
ACCESS_LOG = re.compile(r'^\S+:\d+ - - \[[^]]+\] "')
SLEEP = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (errors included)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def samples(text: str, *, openmetrics: bool = False) -> list[Sample]:
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    return [sample for family in parse(text) for sample in family.samples]


def value(found: list[Sample], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    matching = [s for s in found if s.name == name and labels.items() <= dict(s.labels).items()]
    assert len(matching) == 1, (name, labels, matching)
    return float(matching[0].value)


# -- /healthz and /readyz ----------------------------------------------------------------


def test_healthz_answers_without_touching_anything(stack: Stack) -> None:
    status, headers, body = get(f"{stack.http_url}/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert headers["Cache-Control"] == "no-store"
    request = urllib.request.Request(f"{stack.http_url}/healthz", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    refused.value.close()
    assert refused.value.code in {403, 405}  # CSRF, or the view: GET and HEAD only


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_answer_any_host_over_plain_http(stack: Stack, path: str) -> None:
    """An orchestrator probes the container's own address, in no ALLOWED_HOSTS."""
    eventually(stack.ready, timeout=60)
    request = urllib.request.Request(f"{stack.http_url}{path}", headers={"Host": "10.0.0.7:8000"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
    other = urllib.request.Request(f"{stack.http_url}/abp.json", headers={"Host": "10.0.0.7:8000"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(other, timeout=5)
    refused.value.close()
    assert refused.value.code == 400  # the rest of the site still validates the host


def test_readyz_is_ready_with_the_database_redis_and_live_workers(stack: Stack) -> None:
    eventually(stack.ready, timeout=60)  # warm (a fresh stack warms up for a few seconds)
    status, headers, body = get(f"{stack.http_url}/readyz")
    answer = json.loads(body)
    assert status == 200, answer
    assert answer["status"] == "ready"
    assert answer["checks"] == {
        "database": "ok", "redis": "ok", "workers": "ok", "warm": "ok", "serving": "ok"
    }  # fmt: skip
    assert answer["liveWorkers"] >= 2  # the heavy and the small queue's
    assert headers["Cache-Control"] == "no-store"


def test_a_fresh_daphne_is_ready_once_warm_and_its_first_call_runs_in_its_lane(
    stack: Stack,
) -> None:
    # The lane used to start at the first WebSocket connection: that connection's first
    # call went through Celery, and paid for the start-up (capabilities/calls/warm_up.py).
    with stack.another_web("daphne-fresh") as at:
        answers: list[dict[str, Any]] = []

        def ready() -> bool:
            status, _, body = get(f"http://{at}/readyz")
            answers.append(json.loads(body))
            return status == 200

        eventually(ready, timeout=60, interval=0.05)
        # The first probe began the warm-up; until it was done, the only check that
        # failed was the warm-up's (it may also have finished before the view looked).
        for answer in answers[:-1]:
            assert (answer["failed"], answer["checks"]["warm"]) == (["warm"], "warming")
        assert answers[-1]["checks"]["warm"] == "ok"
        with Agent(f"ws://{at}/abp/ws") as agent:
            agent.initialize()
            call = agent.call("convert.markdownToHtml", {"markdown": "# first"}, call_id="first")
            assert agent.result_of(call)["payload"]["success"] is True
            job = Job.objects.get(session_id=agent.session_id, call_id="first")
    assert job.queue == local_lane.LOCAL_QUEUE


def test_a_draining_daphne_is_not_ready_so_new_sessions_go_elsewhere() -> None:
    request = RequestFactory().get("/readyz", {"exclude": "database,redis,workers,warm"})
    assert asyncio.run(health.readyz(request)).status_code == 200
    with mock.patch("capabilities.calls.draining._draining", threading.Event()) as flag:
        draining.begin()
        assert flag.is_set()
        response = asyncio.run(health.readyz(request))
    assert response.status_code == 503
    assert json.loads(response.content)["checks"]["serving"] == "draining"


def test_readyz_pings_every_channel_layer_shard_and_each_server_once() -> None:
    layers = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"hosts": ["redis://a:6379/0", "redis://b:6379/0"]},
        }
    }
    with override_settings(
        REDIS_URL="redis://a:6379/0", CHANNEL_LAYERS=layers, CELERY_BROKER_URL="redis://c:6379/0"
    ):
        assert cluster_state.redis_servers() == {
            "redis": "redis://a:6379/0",
            "channelLayer2": "redis://b:6379/0",
            "broker": "redis://c:6379/0",
        }


def test_readyz_says_503_and_which_check_failed_when_redis_is_gone(stack: Stack) -> None:
    port = free_port()
    with stack.another_web("daphne-no-redis", {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as at:
        started = time.monotonic()
        status, _, body = get(f"http://{at}/readyz")
        took = time.monotonic() - started
        healthy, _, _ = get(f"http://{at}/healthz")
    answer = json.loads(body)
    assert status == 503
    assert answer["status"] == "unready"
    # Warm or not yet (its warm-up began with this first request): not what is tested.
    warm = answer["checks"].pop("warm")
    assert answer["checks"] == {
        "database": "ok", "redis": "unreachable", "workers": "unknown", "serving": "ok"
    }  # fmt: skip
    assert answer["failed"] == ["redis", "workers"] + ([] if warm == "ok" else ["warm"])
    assert took < 3
    # Nothing about where Redis is.
    assert str(port) not in body.decode()
    assert "127.0.0.1" not in body.decode()
    assert healthy == 200


def test_readyz_says_503_when_no_worker_is_live_unless_workers_are_excluded(
    stack: Stack,
) -> None:
    nobody = {"ABP_WORKER_KEY_PREFIX": "abp:nobody:"}
    with stack.another_web("daphne-no-worker-live", nobody) as at:
        status, _, body = get(f"http://{at}/readyz")
        # Ready once warm (capabilities/calls/warm_up.py), without a live worker.

        def ready_without_workers() -> tuple[int, dict[str, str], bytes] | None:
            found = get(f"http://{at}/readyz?exclude=workers")
            return found if found[0] == 200 else None

        excluded, _, excluded_body = eventually(ready_without_workers, timeout=60)
    answer = json.loads(body)
    assert status == 503
    warm = answer["checks"].pop("warm")
    assert answer["checks"] == {
        "database": "ok", "redis": "ok", "workers": "none live", "serving": "ok"
    }  # fmt: skip
    assert answer["failed"] == ["workers"] + ([] if warm == "ok" else ["warm"])
    assert answer["liveWorkers"] == 0
    assert excluded == 200
    assert json.loads(excluded_body)["checks"]["workers"] == "excluded"


# -- /metrics: who may read it -------------------------------------------------------------


def test_metrics_are_off_in_production_by_default(stack: Stack) -> None:
    status, _, _ = get(f"{stack.http_url}/metrics")
    assert status == 404


@pytest.fixture(scope="module")
def observed(stack: Stack) -> Iterator[str]:
    """host:port of a Daphne with a metrics token, loopback allowed, and JSON logs."""
    env = {
        "ABP_METRICS_TOKEN": TOKEN,
        "ABP_METRICS_ALLOWED_IPS": "127.0.0.0/8",
        "ABP_LOG_FORMAT": "json",
    }
    with stack.another_web("daphne-observed", env) as at:
        yield at


def test_metrics_need_the_bearer_token(observed: str) -> None:
    url = f"http://{observed}/metrics"
    status, headers, _ = get(url)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert get(url, {"Authorization": "Bearer wrong"})[0] == 401
    assert get(url, {"Authorization": f"Basic {TOKEN}"})[0] == 401
    status, headers, _ = get(url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert headers["Cache-Control"] == "no-store"


def test_metrics_refuse_an_address_outside_the_list(stack: Stack) -> None:
    env = {"ABP_METRICS_TOKEN": TOKEN, "ABP_METRICS_ALLOWED_IPS": "10.0.0.0/8"}
    with stack.another_web("daphne-metrics-elsewhere", env) as at:
        status, _, _ = get(f"http://{at}/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 403


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("ABP_METRICS_ALLOWED_IPS", "10.0.0.0/33", "ABP_METRICS_ALLOWED_IPS"),
        ("ABP_METRICS_ALLOWED_IPS", "*", "ABP_METRICS_ALLOWED_IPS"),
        ("ABP_METRICS_TOKEN", "short", "ABP_METRICS_TOKEN"),
        ("ABP_METRICS_WINDOW_SECONDS", "1", "ABP_METRICS_WINDOW_SECONDS"),
        ("ABP_LOG_FORMAT", "xml", "ABP_LOG_FORMAT"),
    ],
)
@pytest.mark.stack  # a process each
def test_bad_metrics_and_log_settings_refuse_to_start(variable: str, value: str, says: str) -> None:
    env = {**os.environ, variable: value, "DJANGO_SETTINGS_MODULE": "abpsite.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert says in done.stderr


# -- /metrics: what it says ----------------------------------------------------------------


def test_metrics_over_http_count_the_calls_made(stack: Stack, observed: str) -> None:
    url = f"http://{observed}/metrics"
    before = samples(get(url, {"Authorization": f"Bearer {TOKEN}"})[2].decode())
    labels = {"status": "succeeded", "capability": "convert.markdownToHtml", "door": "abp"}
    done_before = value(before, "abp_jobs_settled", **labels)
    with Agent(f"ws://{observed}/abp/ws") as agent:
        agent.initialize()
        for n in range(3):
            reply = agent.result_of(agent.call("convert.markdownToHtml", {"markdown": f"# {n}"}))
            assert reply["payload"]["success"] is True
    status, headers, body = get(url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    found = samples(body.decode())
    assert value(found, "abp_jobs_settled", **labels) >= done_before + 3
    assert value(found, "abp_workers_live") >= 2
    assert value(found, "abp_queue_slots", queue="abp.heavy") == 2
    assert value(found, "abp_queue_workers", queue="abp.small") == 1
    assert value(found, "abp_metrics_source_up", source="database") == 1
    assert value(found, "abp_metrics_source_up", source="redis") == 1
    assert value(found, "abp_metrics_window_seconds") == 300
    run = sorted(
        (float(s.labels["le"]), s.value)
        for s in found
        if s.name == "abp_job_run_seconds_bucket"
        and s.labels["capability"] == "convert.markdownToHtml"
        and s.labels["status"] == "succeeded"
    )
    assert run[-1][0] == float("inf")
    assert run[-1][1] >= 3
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(run))  # cumulative
    # Prometheus asks for OpenMetrics: the histograms are gauge histograms there.
    status, headers, body = get(
        url,
        {
            "Authorization": f"Bearer {TOKEN}",
            "Accept": "application/openmetrics-text; version=1.0.0",
        },
    )
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert "# TYPE abp_job_run_seconds gaugehistogram" in text
    assert text.endswith("# EOF\n")
    assert value(samples(text, openmetrics=True), "abp_workers_live") >= 2


@pytest.fixture
def known_jobs(database: None) -> Iterator[dict[str, Any]]:
    """Jobs with known times, of a capability and on a queue of their own (no worker)."""
    capability = f"test.metrics-{uuid.uuid4().hex[:8]}"
    queue = "abp.metrics-test"
    session = AgentSession.objects.create(agent_name="metrics", door=Door.RPC)
    now = timezone.now()

    def at(seconds_ago: float) -> Any:
        return now - timedelta(seconds=seconds_ago)

    def job(status: str, created: float, **times: float | None) -> None:
        fields = {name: (at(ago) if ago is not None else None) for name, ago in times.items()}
        Job.objects.create(
            session=session,
            call_id=str(uuid.uuid4()),
            capability=capability,
            queue=queue,
            status=status,
            created_at=at(created),
            **fields,
        )

    # Succeeded: waited 0.02 s, ran 0.3 s.
    job(JobStatus.SUCCEEDED, 100, started_at=99.98, settled_at=99.68, stopped_at=99.68)
    Job.objects.filter(capability=capability).update(dispatched_at=at(100))
    # Cancelled while running: waited 2 s, ran 3 s, stopped 0.2 s after the cancel.
    job(JobStatus.CANCELLED, 80, started_at=78, settled_at=75, stopped_at=74.8)
    Job.objects.filter(capability=capability, status=JobStatus.CANCELLED).update(
        cancel_source=CancelSource.AGENT, error_code="CANCELLED"
    )
    # Failed, its worker lost: waited 0.4 s, ran 9.6 s.
    job(JobStatus.FAILED, 60, started_at=59.6, settled_at=50, stopped_at=50)
    Job.objects.filter(capability=capability, status=JobStatus.FAILED).update(
        error_code="WORKER_LOST"
    )
    # Settled before the window: in no windowed number.
    job(JobStatus.SUCCEEDED, 7300, started_at=7299, settled_at=7200, stopped_at=7200)
    # Queued for 30 s, waiting for a slot; and one running.
    job(JobStatus.QUEUED, 30)
    job(JobStatus.RUNNING, 20, started_at=19, dispatched_at=20)
    yield {"capability": capability, "queue": queue}
    session.delete()


def test_durations_across_disagreeing_clocks_count_as_zero(
    database: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker host's clock a little behind the web host's: no negative wait or sum."""
    monkeypatch.setattr(cluster_state, "live_workers", list)
    capability = f"test.skew-{uuid.uuid4().hex[:8]}"
    session = AgentSession.objects.create(agent_name="skew", door=Door.ABP)
    now = timezone.now()
    try:
        Job.objects.create(
            session=session,
            call_id=str(uuid.uuid4()),
            capability=capability,
            queue="abp.skew-test",
            status=JobStatus.SUCCEEDED,
            created_at=now,
            started_at=now - timedelta(seconds=0.5),  # "before" it was created
            settled_at=now - timedelta(seconds=0.7),  # and "before" it started
            stopped_at=now,
        )
        found = [s for family in ClusterCollector().collect() for s in family.samples]
        for name, labels in (
            ("abp_job_queue_wait_seconds", {"capability": capability, "queue": "abp.skew-test"}),
            ("abp_job_run_seconds", {"capability": capability, "status": "succeeded"}),
        ):
            assert value(found, f"{name}_gsum", **labels) == 0
            assert value(found, f"{name}_gcount", **labels) == 1
    finally:
        session.delete()


def test_metrics_from_jobs_with_known_times(
    known_jobs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    capability, queue = known_jobs["capability"], known_jobs["queue"]
    worker = LiveWorker(
        hostname="w@metrics",
        queues=(queue,),
        concurrency=3,
        jobs=("a", "b"),
        pid=1,
        announced_at=time.time(),
    )
    monkeypatch.setattr(cluster_state, "live_workers", lambda: [worker])
    found = [s for family in ClusterCollector().collect() for s in family.samples]

    def of(name: str, **labels: str) -> float:
        return value(found, name, capability=capability, **labels)

    assert of("abp_jobs_active", status="queued", door="rpc") == 1
    assert of("abp_jobs_active", status="running", door="rpc") == 1
    assert of("abp_jobs_active", status="running", door="abp") == 0
    assert of("abp_jobs_settled", status="succeeded", door="rpc") == 1
    assert of("abp_jobs_settled", status="cancelled", door="rpc") == 1
    assert of("abp_jobs_settled", status="failed", door="rpc") == 1
    assert of("abp_jobs_settled", status="failed", door="mcp") == 0
    assert of("abp_jobs_settled_by_reason", status="failed", reason="WORKER_LOST") == 1
    assert of("abp_jobs_settled_by_reason", status="cancelled", reason="agent") == 1
    assert of("abp_jobs_cancelled_not_stopped") == 0
    # Run time: 0.3 s, 3 s, 9.6 s.
    assert of("abp_job_run_seconds_bucket", status="succeeded", le="0.25") == 0
    assert of("abp_job_run_seconds_bucket", status="succeeded", le="0.5") == 1
    assert of("abp_job_run_seconds_bucket", status="cancelled", le="2.5") == 0
    assert of("abp_job_run_seconds_bucket", status="cancelled", le="5.0") == 1
    assert of("abp_job_run_seconds_bucket", status="failed", le="5.0") == 0
    assert of("abp_job_run_seconds_bucket", status="failed", le="10.0") == 1
    assert of("abp_job_run_seconds_gcount", status="failed") == 1
    assert of("abp_job_run_seconds_gsum", status="succeeded") == pytest.approx(0.3, abs=1e-3)
    # Queue wait: 0.02 s, 2 s, 0.4 s (the heavy queue: the capability is no product's).
    wait = {"queue": "abp.heavy"}
    assert of("abp_job_queue_wait_seconds_bucket", le="0.01", **wait) == 0
    assert of("abp_job_queue_wait_seconds_bucket", le="0.025", **wait) == 0
    assert of("abp_job_queue_wait_seconds_bucket", le="0.025", queue=queue) == 1
    assert of("abp_job_queue_wait_seconds_bucket", le="0.5", queue=queue) == 2
    assert of("abp_job_queue_wait_seconds_bucket", le="+Inf", queue=queue) == 3
    assert of("abp_job_queue_wait_seconds_gsum", queue=queue) == pytest.approx(2.42, abs=1e-3)
    # Cancel to stopped: 0.2 s.
    assert of("abp_job_cancel_to_stop_seconds_bucket", le="0.1") == 0
    assert of("abp_job_cancel_to_stop_seconds_bucket", le="0.25") == 1
    assert of("abp_job_cancel_to_stop_seconds_gsum") == pytest.approx(0.2, abs=1e-3)
    # The queue of their own: one waiting 30 s, one running, a worker with 3 slots.
    assert value(found, "abp_queue_depth", queue=queue, state="waiting") == 1
    assert value(found, "abp_queue_depth", queue=queue, state="dispatched") == 0
    assert value(found, "abp_queue_running", queue=queue) == 1
    assert value(found, "abp_queue_oldest_seconds", queue=queue) == pytest.approx(30, abs=5)
    assert value(found, "abp_queue_slots", queue=queue) == 3
    assert value(found, "abp_queue_workers", queue=queue) == 1
    assert value(found, "abp_workers_live") == 1
    assert value(found, "abp_worker_jobs_running") == 2
    assert value(found, "abp_sessions_open", door="rpc", state="attached") >= 1


def test_a_job_cancelled_while_running_counts_until_its_work_stops(
    known_jobs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_state, "live_workers", list)
    running = Job.objects.get(capability=known_jobs["capability"], status=JobStatus.RUNNING)
    assert lifecycle.settle(running.id, lifecycle.Outcome.cancelled(CancelSource.OPERATOR))

    def unstopped() -> float:
        found = [s for family in ClusterCollector().collect() for s in family.samples]
        return value(found, "abp_jobs_cancelled_not_stopped", capability=known_jobs["capability"])

    assert unstopped() == 1
    lifecycle.record_stopped(running.id)
    assert unstopped() == 0


def test_a_source_that_cannot_be_read_is_reported_down(
    database: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gone() -> list[LiveWorker]:
        raise ConnectionError("no redis here")

    monkeypatch.setattr(cluster_state, "live_workers", gone)
    found = [s for family in ClusterCollector().collect() for s in family.samples]
    assert value(found, "abp_metrics_source_up", source="redis") == 0
    assert value(found, "abp_metrics_source_up", source="database") == 1
    assert value(found, "abp_workers_live") == 0


# -- job events ----------------------------------------------------------------------------


@pytest.fixture
def job_events(
    database: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.LogCaptureFixture]:
    """abp.jobs on, Celery and Redis out of the way; the job events logged."""
    monkeypatch.setattr(dispatch, "created", lambda job: None)
    monkeypatch.setattr(dispatch, "pump_safely", lambda queues=None: None)
    monkeypatch.setattr(cancellation, "tell_session", lambda job_id: None)
    caplog.set_level(logging.INFO, logger="abp.jobs")
    yield caplog
    AgentSession.objects.filter(agent_name="events").delete()


def events_of(records: list[logging.LogRecord], job_id: object) -> list[dict[str, Any]]:
    return [
        dict(vars(r))
        for r in records
        if r.name == "abp.jobs" and getattr(r, "jobId", None) == str(job_id)
    ]


def new_job(session: AgentSession, *, go_now: bool, monkeypatch: pytest.MonkeyPatch) -> Job:
    monkeypatch.setattr(dispatch, "may_go_now", lambda *args: go_now)
    return lifecycle.create_job(
        session_id=str(session.id),
        call_id=f"call-{uuid.uuid4().hex[:6]}",
        request_id="r1",
        capability="test.sleep",
        params={},
        timeout_ms=60_000,
        progress_token=None,
        principal="key:abcd1234",
    )


def test_each_transition_of_a_job_is_logged_once_with_its_fields(
    job_events: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = AgentSession.objects.create(agent_name="events", door=Door.MCP)
    job = new_job(session, go_now=True, monkeypatch=monkeypatch)
    assert lifecycle.mark_running(str(job.id), "heavy@host")
    lifecycle.heartbeat(str(job.id))
    assert lifecycle.settle(job.id, lifecycle.Outcome.cancelled(CancelSource.AGENT, "why"))
    assert not lifecycle.settle(job.id, lifecycle.Outcome.succeeded({}))
    lifecycle.record_stopped(job.id)
    lifecycle.record_stopped(job.id)  # the first report won

    logged = events_of(job_events.records, job.id)
    assert [e["event"] for e in logged] == [
        "created",
        "dispatched",
        "started",
        "settled",
        "stopped",
    ]
    for event in logged:
        assert event["callId"] == job.call_id
        assert event["sessionId"] == str(session.id)
        assert event["agent"] == "key:abcd1234"
        assert event["capability"] == "test.sleep"
        assert event["queue"] == "abp.heavy"
        assert event["door"] == "mcp"
    assert logged[2]["worker"] == "heavy@host"
    assert logged[3]["outcome"] == "cancelled"
    assert logged[3]["cancelSource"] == "agent"
    assert logged[3]["errorCode"] == "CANCELLED"
    assert logged[3]["workStopped"] is False
    assert all(
        r.getMessage() == f"job {r.__dict__['event']}"
        for r in job_events.records
        if r.name == "abp.jobs"
    )


def test_a_waiting_job_is_logged_when_handed_over_and_a_lost_one_when_it_fails(
    job_events: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = AgentSession.objects.create(agent_name="events", door=Door.RPC)
    waiting = new_job(session, go_now=False, monkeypatch=monkeypatch)
    assert dispatch.claim(waiting.id)
    assert not dispatch.claim(waiting.id)
    assert lifecycle.mark_running(str(waiting.id), "w")
    assert cancellation.fail_lost(waiting.id, last_seen=timezone.now())
    never = new_job(session, go_now=False, monkeypatch=monkeypatch)
    assert lifecycle.settle(never.id, lifecycle.Outcome.cancelled(CancelSource.TIMEOUT))

    logged = events_of(job_events.records, waiting.id)
    assert [e["event"] for e in logged] == [
        "created",
        "dispatched",
        "started",
        "settled",
        "stopped",
    ]
    assert logged[3]["outcome"] == "failed"
    assert logged[3]["errorCode"] == "WORKER_LOST"
    assert {e["door"] for e in logged} == {"rpc"}
    never_logged = events_of(job_events.records, never.id)
    assert [e["event"] for e in never_logged] == ["created", "settled"]
    assert never_logged[1]["workStopped"] is True  # it never started
    assert never_logged[1]["cancelSource"] == "timeout"


def test_job_events_off_log_nothing_and_change_nothing(
    database: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "created", lambda job: None)
    caplog.set_level(logging.WARNING, logger="abp.jobs")
    session = AgentSession.objects.create(agent_name="events", door=Door.ABP)
    try:
        job = new_job(session, go_now=True, monkeypatch=monkeypatch)
        assert lifecycle.mark_running(str(job.id), "w")
        assert not lifecycle.mark_running(str(job.id), "w")
        assert lifecycle.settle(job.id, lifecycle.Outcome.succeeded({"a": 1}))
        assert not lifecycle.settle(job.id, lifecycle.Outcome.succeeded({"a": 2}))
        assert [r for r in caplog.records if r.name == "abp.jobs"] == []
        job.refresh_from_db()
        assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"a": 1})
    finally:
        session.delete()


def test_json_lines_carry_the_event_fields_at_the_top_level() -> None:
    options = dict(settings.LOGGING["formatters"]["json"])
    options.pop("()")
    record = logging.LogRecord("abp.jobs", logging.INFO, __file__, 1, "job %s", ("settled",), None)
    record.__dict__.update({"event": "settled", "callId": "c1", "door": "abp"})
    line = json.loads(JsonFormatter(**options).format(record))
    assert line["message"] == "job settled"
    assert (line["level"], line["logger"]) == ("INFO", "abp.jobs")
    assert (line["event"], line["callId"], line["door"]) == ("settled", "c1", "abp")
    assert "time" in line
    assert "pid" in line
    plain = PlainFormatter("%(name)s: %(message)s").format(record)
    assert plain == "abp.jobs: job settled event=settled callId=c1 door=abp"
    other = logging.LogRecord("celery", logging.INFO, __file__, 1, "hello", None, None)
    other.__dict__["data"] = {"x": 1}
    assert PlainFormatter("%(name)s: %(message)s").format(other) == "celery: hello"


def test_a_json_daphne_logs_its_calls_events_as_json_lines(stack: Stack, observed: str) -> None:
    with Agent(f"ws://{observed}/abp/ws") as agent:
        agent.initialize()
        sleeping = agent.call("test.sleep", SLEEP, call_id="to-cancel")
        eventually(
            Job.objects.filter(
                session_id=agent.session_id, call_id="to-cancel", status=JobStatus.RUNNING
            ).exists
        )
        agent.cancel("to-cancel")
        assert agent.result_of(sleeping)["payload"]["cancelled"] is True
        session_id = str(agent.session_id)
    log = stack.run_dir / "daphne-observed.log"

    def events() -> list[dict[str, Any]]:
        # Every line is JSON but Daphne's access log, which it prints itself.
        lines = [
            json.loads(line)
            for line in log.read_text().splitlines()
            if line.strip() and not ACCESS_LOG.match(line)
        ]
        return [e for e in lines if e.get("callId") == "to-cancel" and e["sessionId"] == session_id]

    def settled() -> list[dict[str, Any]] | None:
        found = events()
        return found if any(e["event"] == "settled" for e in found) else None

    logged = eventually(settled)
    # Daphne creates, hands over (unless a pump elsewhere did) and settles the cancel it
    # won; the worker, which logs text here, starts it.
    names = [e["event"] for e in logged]
    assert names in (["created", "dispatched", "settled"], ["created", "settled"])
    assert {e["door"] for e in logged} == {"abp"}
    assert {e["capability"] for e in logged} == {"test.sleep"}
    assert all(e["agent"].startswith("key:") for e in logged)
    assert logged[-1]["outcome"] == "cancelled"
    assert logged[-1]["cancelSource"] == "agent"
    assert {e["logger"] for e in logged} == {"abp.jobs"}
