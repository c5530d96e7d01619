"""The metrics of /metrics, read from the database and Redis at scrape time.

Web processes and workers run on several hosts, so counters kept in one process would
count only its share. This collector reads the cluster's truth when scraped, and every
web process answers the same numbers: three aggregate statements on the database (jobs
queued or running; jobs settled within the window; open sessions) and two Redis
commands (the live workers' announcements). docs/operating.md#health-and-metrics says
what each metric means; the window is ABP_METRICS_WINDOW_SECONDS.

The windowed numbers are gauges over "jobs settled in the last window", histograms
included (OpenMetrics gauge histograms: their buckets go down as jobs leave the
window), so they need no rate(): histogram_quantile over the buckets is the quantile
over the window. Statements are built once per database vendor from the models'
metadata; the window is served by an index on settled_at (job_settled_idx), the rest by
the status and open-session indexes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Model
from django.utils import timezone
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capabilities.conf import metrics_settings
from capabilities.jobs import queue as job_queues
from capabilities.jobs.columns import quoted_column
from capabilities.jobs.workers import LiveWorker, capacity
from capabilities.models import AgentSession, Door, Job, JobStatus
from capabilities.web import cluster_state
from capabilities.work import registry

logger = logging.getLogger(__name__)

# Upper bounds (seconds) of the histograms' buckets; +Inf is added.
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
STOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30)
_HISTOGRAMS = (("run", RUN_BUCKETS), ("wait", WAIT_BUCKETS), ("stop", STOP_BUCKETS))
SETTLED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


class UnsupportedDatabase(Exception):
    """Only SQLite and PostgreSQL are read (the project runs on nothing else)."""


def _column(model: type[Model], name: str) -> str:
    return f"{connection.ops.quote_name(model._meta.db_table)}.{quoted_column(model, name)}"


def _seconds(vendor: str, later: str, earlier: str) -> str:
    """SQL for `later - earlier` in seconds, never below 0 (a float; NULL if either is).

    Never below 0: the two times may come from two hosts' clocks (a web node created
    the job, a worker node started it), which may disagree by a little, and a
    histogram's sum must not go negative.
    """
    if vendor == "sqlite":
        return f"MAX(0.0, (julianday({later}) - julianday({earlier})) * 86400.0)"
    if vendor == "postgresql":
        # date_part: double precision (EXTRACT answers numeric, slower to compare).
        # Both times are never NULL where this is used (GREATEST would skip a NULL).
        return f"GREATEST(0.0, date_part('epoch', {later} - {earlier}))"
    raise UnsupportedDatabase(vendor)


def _join() -> str:
    quote = connection.ops.quote_name
    jobs, sessions = quote(Job._meta.db_table), quote(AgentSession._meta.db_table)
    return f"{jobs} JOIN {sessions} ON {_column(AgentSession, 'id')} = {_column(Job, 'session')}"


@functools.cache
def _active_statement(vendor: str) -> str:
    """Queued and running jobs by status, capability, queue, door and hand-over; the oldest
    not started."""
    status, handed = _column(Job, "status"), _column(Job, "dispatched_at")
    handed_flag = f"CASE WHEN {handed} IS NULL THEN 0 ELSE 1 END"
    keys = f"{status}, {_column(Job, 'capability')}, {_column(Job, 'queue')}, " + (
        f"{_column(AgentSession, 'door')}, {handed_flag}"
    )
    age = _seconds(vendor, "%s", _column(Job, "created_at"))
    return (
        f"SELECT {keys}, COUNT(*),"
        f" MAX(CASE WHEN {status} = '{JobStatus.QUEUED.value}' THEN {age} END)"
        f" FROM {_join()}"
        f" WHERE {status} IN ('{JobStatus.QUEUED.value}', '{JobStatus.RUNNING.value}')"
        f" GROUP BY {keys}"
    )


@functools.cache
def _window_statement(vendor: str) -> str:
    """Jobs settled since %s, by capability, queue, status, door, error code and cancel
    source: counts, and the three histograms' bucket counts and sums."""
    col = functools.partial(_column, Job)
    status, started = col("status"), col("started_at")
    cancelled = f"{status} = '{JobStatus.CANCELLED.value}'"
    settled, stopped = col("settled_at"), col("stopped_at")
    inner = ", ".join(
        [
            f"{col('capability')} AS capability",
            f"{col('queue')} AS queue",
            f"{status} AS status",
            f"{_column(AgentSession, 'door')} AS door",
            f"{col('error_code')} AS error_code",
            f"{col('cancel_source')} AS cancel_source",
            f"CASE WHEN {started} IS NOT NULL THEN {_seconds(vendor, settled, started)} END AS run",
            f"CASE WHEN {started} IS NOT NULL"
            f" THEN {_seconds(vendor, started, col('created_at'))} END AS wait",
            f"CASE WHEN {cancelled} AND {started} IS NOT NULL AND {stopped} IS NOT NULL"
            f" THEN {_seconds(vendor, stopped, settled)} END AS stop",
            f"CASE WHEN {cancelled} AND {started} IS NOT NULL AND {stopped} IS NULL"
            " THEN 1 ELSE 0 END AS unstopped",
            f"CASE WHEN {col('hard_killed')} THEN 1 ELSE 0 END AS killed",
        ]
    )
    sums = ["COUNT(*)", "SUM(unstopped)", "SUM(killed)"]
    for name, bounds in _HISTOGRAMS:
        sums += [f"COUNT({name})", f"COALESCE(SUM({name}), 0)"]
        sums += [f"SUM(CASE WHEN {name} <= {float(b)!r} THEN 1 ELSE 0 END)" for b in bounds]
    keys = "capability, queue, status, door, error_code, cancel_source"
    # MATERIALIZED: each duration is computed once per row, not once per bucket (SQLite
    # would otherwise flatten the subquery into the sums).
    return (
        f"WITH recent AS MATERIALIZED (SELECT {inner} FROM {_join()} WHERE {settled} >= %s)"
        f" SELECT {keys}, {', '.join(sums)} FROM recent GROUP BY {keys}"
    )


@functools.cache
def _sessions_statement(vendor: str) -> str:
    """Open sessions by door, held by a connection or detached (waiting for a resume).

    A session-less MCP call's own row is a call, not a session: it is left out.
    """
    quote = connection.ops.quote_name
    detached = f"CASE WHEN {_column(AgentSession, 'detached_at')} IS NULL THEN 0 ELSE 1 END"
    door = _column(AgentSession, "door")
    return (
        f"SELECT {door}, {detached}, COUNT(*) FROM {quote(AgentSession._meta.db_table)}"
        f" WHERE {_column(AgentSession, 'closed_at')} IS NULL"
        f" AND NOT {_column(AgentSession, 'per_call')} GROUP BY {door}, {detached}"
    )


@dataclass
class _Histogram:
    """Cumulative bucket counts, their count and their sum, for one label set."""

    bounds: Sequence[float]
    buckets: list[float] = field(default_factory=list)
    count: float = 0.0
    total: float = 0.0

    def add(self, count: float, total: float, buckets: Sequence[float]) -> None:
        if not self.buckets:
            self.buckets = [0.0] * len(self.bounds)
        self.count += count
        self.total += total
        self.buckets = [mine + more for mine, more in zip(self.buckets, buckets, strict=True)]

    def samples(self) -> list[tuple[str, float]]:
        buckets = self.buckets or [0.0] * len(self.bounds)
        return [
            *((_bound(b), n) for b, n in zip(self.bounds, buckets, strict=True)),
            ("+Inf", self.count),
        ]


def _bound(value: float) -> str:
    return repr(float(value))


@dataclass
class _Reading:
    """What one scrape read, by source."""

    capabilities: list[str]
    doors: list[str]
    queues: set[str]
    active: list[tuple[Any, ...]] = field(default_factory=list)
    window: list[tuple[Any, ...]] = field(default_factory=list)
    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    workers: list[LiveWorker] = field(default_factory=list)
    up: dict[str, bool] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class ClusterCollector(Collector):
    """Every metric of /metrics, read anew at each scrape (docs/operating.md)."""

    def collect(self) -> Iterator[Metric]:
        reading = self.read()
        yield from self._jobs(reading)
        yield from self._queues(reading)
        yield from self._sessions_and_workers(reading)
        yield from self._about(reading)

    def read(self) -> _Reading:
        """Read the database and Redis; a source that fails is reported down, not raised."""
        capabilities = [spec.name for spec in registry.all_specs()]
        reading = _Reading(
            capabilities=capabilities,
            doors=list(Door.values),
            queues={job_queues.queue_for(name) for name in capabilities},
        )
        started = time.monotonic()
        try:
            self._read_database(reading)
            reading.up["database"] = True
        except Exception:
            logger.exception("Metrics: could not read the database")
            reading.up["database"] = False
        reading.seconds["database"] = time.monotonic() - started
        started = time.monotonic()
        try:
            reading.workers = cluster_state.live_workers()
            reading.up["redis"] = True
        except Exception:
            logger.exception("Metrics: could not read the live workers from Redis")
            reading.up["redis"] = False
        reading.seconds["redis"] = time.monotonic() - started
        for worker in reading.workers:
            reading.queues.update(worker.queues)
        return reading

    @staticmethod
    def _read_database(reading: _Reading) -> None:
        vendor = connection.vendor
        now = timezone.now()
        since = now - timedelta(seconds=metrics_settings().WINDOW_SECONDS)
        with connection.cursor() as cursor:
            cursor.execute(_active_statement(vendor), [_datetime(now)])
            reading.active = [tuple(row) for row in cursor.fetchall()]
            cursor.execute(_window_statement(vendor), [_datetime(since)])
            reading.window = [tuple(row) for row in cursor.fetchall()]
            cursor.execute(_sessions_statement(vendor))
            reading.sessions = [tuple(row) for row in cursor.fetchall()]
        for row in reading.active:
            reading.queues.add(str(row[2]))
        for row in reading.window:
            reading.queues.add(str(row[1]))

    def _jobs(self, reading: _Reading) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "abp_jobs_active",
            "Jobs queued or running now, by status, capability and front door.",
            labels=["status", "capability", "door"],
        )
        settled = GaugeMetricFamily(
            "abp_jobs_settled",
            "Jobs settled within the window, by outcome, capability and front door.",
            labels=["status", "capability", "door"],
        )
        reasons = GaugeMetricFamily(
            "abp_jobs_settled_by_reason",
            "Jobs failed (by error code) or cancelled (by cancel source) within the window.",
            labels=["status", "reason", "capability"],
        )
        unstopped = GaugeMetricFamily(
            "abp_jobs_cancelled_not_stopped",
            "Jobs cancelled within the window while running whose work has not stopped yet.",
            labels=["capability"],
        )
        killed = GaugeMetricFamily(
            "abp_jobs_hard_killed",
            "Jobs settled within the window whose worker was SIGKILLed after ignoring a cancel.",
            labels=["capability"],
        )
        counts: dict[tuple[str, ...], float] = defaultdict(float)
        for row in reading.active:
            counts[(str(row[0]), str(row[1]), str(row[3]))] += float(row[5])
        for status in (JobStatus.QUEUED.value, JobStatus.RUNNING.value):
            for capability in self._names(reading.capabilities, counts, 1):
                for door in reading.doors:
                    key: tuple[str, ...] = (status, capability, door)
                    active.add_metric([*key], counts.get(key, 0))
        done: dict[tuple[str, ...], float] = defaultdict(float)
        why: dict[tuple[str, ...], float] = defaultdict(float)
        still: dict[str, float] = defaultdict(float)
        kills: dict[str, float] = defaultdict(float)
        run: dict[tuple[str, ...], _Histogram] = {}
        wait: dict[tuple[str, ...], _Histogram] = {}
        stop: dict[tuple[str, ...], _Histogram] = {}
        for row in reading.window:
            capability, queue, status, door, error_code, cancel_source = map(str, row[:6])
            number = [float(value or 0) for value in row[6:]]
            done[(status, capability, door)] += number[0]
            if status == JobStatus.FAILED.value:
                why[(status, error_code or "unknown", capability)] += number[0]
            elif status == JobStatus.CANCELLED.value:
                why[(status, cancel_source or "unknown", capability)] += number[0]
            still[capability] += number[1]
            kills[capability] += number[2]
            at = 3
            for (_name, bounds), into, key in zip(
                _HISTOGRAMS,
                (run, wait, stop),
                ((capability, status), (capability, queue), (capability,)),
                strict=True,
            ):
                histogram = into.setdefault(key, _Histogram(bounds))
                histogram.add(number[at], number[at + 1], number[at + 2 : at + 2 + len(bounds)])
                at += 2 + len(bounds)
        capabilities = self._names(reading.capabilities, done, 1)
        for status in SETTLED:
            for capability in capabilities:
                for door in reading.doors:
                    key = (status, capability, door)
                    settled.add_metric([*key], done.get(key, 0))
        for (status, reason, capability), value in sorted(why.items()):
            reasons.add_metric([status, reason, capability], value)
        for capability in capabilities:
            unstopped.add_metric([capability], still.get(capability, 0))
            killed.add_metric([capability], kills.get(capability, 0))
        yield from (active, settled, reasons, unstopped, killed)
        yield from self._histograms(reading, capabilities, run, wait, stop)

    def _histograms(
        self,
        reading: _Reading,
        capabilities: list[str],
        run: dict[tuple[str, ...], _Histogram],
        wait: dict[tuple[str, ...], _Histogram],
        stop: dict[tuple[str, ...], _Histogram],
    ) -> Iterator[Metric]:
        run_family = GaugeHistogramMetricFamily(
            "abp_job_run_seconds",
            "Run time (started to settled) of jobs settled within the window that had started.",
            labels=["capability", "status"],
        )
        for capability in capabilities:
            for status in SETTLED:
                key: tuple[str, ...] = (capability, status)
                histogram = run.get(key, _Histogram(RUN_BUCKETS))
                run_family.add_metric([*key], histogram.samples(), histogram.total)
        wait_family = GaugeHistogramMetricFamily(
            "abp_job_queue_wait_seconds",
            "Queue wait (created to started) of jobs settled within the window that had started.",
            labels=["capability", "queue"],
        )
        for capability in capabilities:
            key = (capability, job_queues.queue_for(capability))
            histogram = wait.get(key, _Histogram(WAIT_BUCKETS))
            wait_family.add_metric([*key], histogram.samples(), histogram.total)
        for key, histogram in wait.items():  # jobs of a queue the capability has since left
            if key[0] in capabilities and key[1] != job_queues.queue_for(key[0]):
                wait_family.add_metric([*key], histogram.samples(), histogram.total)
        stop_family = GaugeHistogramMetricFamily(
            "abp_job_cancel_to_stop_seconds",
            "Time from the cancel (settled) to the work stopped, of jobs cancelled within the "
            "window while running whose work has stopped.",
            labels=["capability"],
        )
        for capability in capabilities:
            histogram = stop.get((capability,), _Histogram(STOP_BUCKETS))
            stop_family.add_metric([capability], histogram.samples(), histogram.total)
        yield from (run_family, wait_family, stop_family)

    def _queues(self, reading: _Reading) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "abp_queue_depth",
            "Jobs queued and not started: waiting in the database for a slot, or dispatched "
            "(handed to Celery).",
            labels=["queue", "state"],
        )
        running = GaugeMetricFamily(
            "abp_queue_running", "Jobs running now, by queue.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "abp_queue_oldest_seconds",
            "Age of the oldest job queued and not started on the queue (0: none).",
            labels=["queue"],
        )
        slots = GaugeMetricFamily(
            "abp_queue_slots",
            "Job slots on the queue: the concurrency of the live workers consuming it.",
            labels=["queue"],
        )
        consumers = GaugeMetricFamily(
            "abp_queue_workers", "Live workers consuming the queue.", labels=["queue"]
        )
        waiting: dict[str, float] = defaultdict(float)
        handed: dict[str, float] = defaultdict(float)
        busy: dict[str, float] = defaultdict(float)
        age: dict[str, float] = defaultdict(float)
        for status, _capability, queue, _door, dispatched, count, old in reading.active:
            if status == JobStatus.RUNNING.value:
                busy[queue] += float(count)
                continue
            (handed if dispatched else waiting)[queue] += float(count)
            age[queue] = max(age[queue], float(old or 0))
        capacity_by_queue = capacity(reading.workers)
        for queue in sorted(reading.queues):
            depth.add_metric([queue, "waiting"], waiting.get(queue, 0))
            depth.add_metric([queue, "dispatched"], handed.get(queue, 0))
            running.add_metric([queue], busy.get(queue, 0))
            oldest.add_metric([queue], age.get(queue, 0))
            slots.add_metric([queue], capacity_by_queue.get(queue, 0))
            consumers.add_metric(
                [queue], sum(1 for worker in reading.workers if queue in worker.queues)
            )
        yield from (depth, running, oldest, slots, consumers)

    @staticmethod
    def _sessions_and_workers(reading: _Reading) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(
            "abp_sessions_open",
            "Open sessions by front door: held by a connection (attached), or detached and "
            "waiting for a resume.",
            labels=["door", "state"],
        )
        counts = {(str(door), int(detached)): float(n) for door, detached, n in reading.sessions}
        for door in reading.doors:
            sessions.add_metric([door, "attached"], counts.get((door, 0), 0))
            sessions.add_metric([door, "detached"], counts.get((door, 1), 0))
        yield sessions
        yield GaugeMetricFamily(
            "abp_workers_live",
            "Live Celery workers (announced in Redis within their TTL).",
            value=len(reading.workers),
        )
        busy = GaugeMetricFamily(
            "abp_worker_jobs_running",
            "Jobs the live workers say they run (their last announcement).",
            value=sum(len(worker.jobs) for worker in reading.workers),
        )
        yield busy

    @staticmethod
    def _about(reading: _Reading) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "abp_metrics_window_seconds",
            "The window of the abp_jobs_settled* gauges and the histograms.",
            value=metrics_settings().WINDOW_SECONDS,
        )
        up = GaugeMetricFamily(
            "abp_metrics_source_up",
            "Whether this scrape could read the source (database, redis): 1 or 0.",
            labels=["source"],
        )
        took = GaugeMetricFamily(
            "abp_metrics_read_seconds",
            "How long this scrape took to read the source.",
            labels=["source"],
        )
        for source in ("database", "redis"):
            up.add_metric([source], 1 if reading.up.get(source) else 0)
            took.add_metric([source], reading.seconds.get(source, 0.0))
        yield from (up, took)

    @staticmethod
    def _names(known: list[str], seen: dict[tuple[str, ...], float], at: int) -> list[str]:
        """Every known capability, and any other the rows name (one since removed)."""
        return sorted({*known, *(key[at] for key in seen)})


def _datetime(value: datetime) -> Any:
    """A datetime as the database backend wants it as a query parameter."""
    return connection.ops.adapt_datetimefield_value(value)
