"""The job rows, read every few seconds: each job's history, and what must not happen to it.

Read straight from PostgreSQL (the database's clock for every comparison), across its
restarts. A job row must not: vanish before its retention is up (lost); share its call's
tag with another row (duplicated); stay queued or running past its deadline plus the
grace; run on, cancelled, past the hard-kill grace (its `stopped_at` says when the work
stopped); outlive its retention plus a clean-up pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from tests.support.soak.ledger import Ledger
from tests.support.soak.plan import ROW_TAG_SQL

COLUMNS = (
    "id", "tag", "status", "error_code", "cancel_source", "created_at", "started_at",
    "settled_at", "stopped_at", "deadline", "worker", "session_id",
)  # fmt: skip
QUERY = (
    f"SELECT id::text, {ROW_TAG_SQL}, status, error_code, cancel_source, created_at,"
    " started_at, settled_at, stopped_at, deadline, worker, session_id::text, now()"
    " FROM capabilities_job"
)
# A job queued or running this long past its deadline has been missed by the reaper
# (it sweeps every 0.5 s here; a beat or PostgreSQL restart pauses it for seconds).
DEADLINE_GRACE_SECONDS = 20.0
# A cancelled job's work must stop within the hard-kill grace (1.5 s here), plus the
# reaper's pass that kills it and a restart of whatever it waits on.
STOP_GRACE_SECONDS = 20.0
ACTIVE = ("queued", "running")


@dataclass
class Finding:
    """Something wrong with a row: what, when (run clock), the job, its call's tag."""

    kind: str
    at: float
    job_id: str
    tag: str
    detail: str


@dataclass
class JobHistory:
    """A job as seen over time: its last row and each status change."""

    row: dict[str, Any]
    changes: list[tuple[float, str]] = field(default_factory=list)
    gone_at: float | None = None


class RowWatch:
    """Reads the table every `every` s; keeps each job's history and the findings."""

    def __init__(self, url: str, ledger: Ledger, *, retention: float, bound: float) -> None:
        self.url = url
        self.ledger = ledger
        self.retention = retention
        self.bound = bound
        self.jobs: dict[str, JobHistory] = {}
        self.by_tag: dict[str, set[str]] = {}
        self.findings: list[Finding] = []
        self._flagged: set[tuple[str, str]] = set()
        self.counts: list[tuple[float, int]] = []  # (run clock, rows) per read
        self.failed_reads = 0

    async def run(self, stop: asyncio.Event, every: float = 3.0) -> None:
        """Read until `stop`, then once more."""
        while not stop.is_set():
            await self.read_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
        await self.read_once()

    async def read_once(self) -> None:
        """One read of the table (skipped while PostgreSQL is down)."""
        try:
            rows = await asyncio.to_thread(self._query)
        except psycopg.Error:
            self.failed_reads += 1
            return
        self._observe(rows, self.ledger.now())

    def _query(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as connection:
            return connection.execute(QUERY).fetchall()

    def _observe(self, rows: list[tuple[Any, ...]], at: float) -> None:
        seen = set()
        db_now: datetime | None = None
        for values in rows:
            row = dict(zip(COLUMNS, values[:-1], strict=True))
            db_now = values[-1]
            job_id, tag = row["id"], str(row["tag"])
            seen.add(job_id)
            history = self.jobs.get(job_id)
            if history is None:
                history = self.jobs[job_id] = JobHistory(row, [(at, row["status"])])
                self.by_tag.setdefault(tag, set()).add(job_id)
                if len(self.by_tag[tag]) > 1:
                    self._flag("duplicated", at, row, f"jobs {sorted(self.by_tag[tag])}")
            elif history.row["status"] != row["status"]:
                history.changes.append((at, row["status"]))
            history.row = row
            self._check(row, at, db_now)
        self.counts.append((at, len(rows)))
        if db_now is None:
            return
        self._check_bound(at, db_now)
        for job_id, history in self.jobs.items():
            if job_id in seen or history.gone_at is not None:
                continue
            history.gone_at = at
            settled = history.row["settled_at"]
            age = (db_now - settled).total_seconds() if settled else None
            if age is None or age < self.retention:
                self._flag("lost", at, history.row, f"gone {age} s after its settle")

    def _check(self, row: dict[str, Any], at: float, now: datetime) -> None:
        deadline, settled, stopped = row["deadline"], row["settled_at"], row["stopped_at"]
        if row["status"] in ACTIVE and deadline is not None:
            late = (now - deadline).total_seconds()
            if late > DEADLINE_GRACE_SECONDS:
                self._flag("past its deadline", at, row, f"{row['status']} {late:.1f} s past it")
        if row["status"] == "cancelled" and row["started_at"] is not None and settled is not None:
            if stopped is None and (now - settled).total_seconds() > STOP_GRACE_SECONDS:
                self._flag("work after its settle", at, row, "cancelled, its work not stopped")
            elif stopped is not None and (stopped - settled).total_seconds() > STOP_GRACE_SECONDS:
                ran = (stopped - settled).total_seconds()
                self._flag("work after its settle", at, row, f"stopped {ran:.1f} s after it")

    def _check_bound(self, at: float, now: datetime) -> None:
        """Rows settled longer ago than the bound: one finding a minute, with the oldest."""
        kept = [
            h.row for h in self.jobs.values()
            if h.gone_at is None and h.row["settled_at"] is not None
            and (now - h.row["settled_at"]).total_seconds() > self.bound
        ]  # fmt: skip
        if kept:
            oldest = min(kept, key=lambda row: row["settled_at"])
            age = (now - oldest["settled_at"]).total_seconds()
            detail = (
                f"{len(kept)} rows kept past {self.bound:g} s; the oldest settled {age:.0f} s ago"
            )
            self._flag(
                "kept past retention", at, {**oldest, "id": f"minute {int(at // 60)}"}, detail
            )

    def _flag(self, kind: str, at: float, row: dict[str, Any], detail: str) -> None:
        if (kind, row["id"]) in self._flagged:
            return
        self._flagged.add((kind, row["id"]))
        self.findings.append(Finding(kind, at, row["id"], str(row["tag"]), detail))

    def rows_of(self, tag: str) -> list[JobHistory]:
        """Every job seen for a call's tag."""
        return [self.jobs[job_id] for job_id in sorted(self.by_tag.get(tag, ()))]


def busy_percent(jobs: dict[str, JobHistory], worker_prefix: str, slots: int) -> float | None:
    """How busy the workers named `worker_prefix...` were: their jobs' run time (start to
    stop or settle) over `slots` times the span from the first start to the last end."""
    spans = []
    for history in jobs.values():
        row = history.row
        started, ended = row["started_at"], row["stopped_at"] or row["settled_at"]
        if str(row["worker"] or "").startswith(worker_prefix) and started and ended:
            spans.append((started, max(started, ended)))
    if not spans or slots <= 0:
        return None
    span = (max(end for _, end in spans) - min(start for start, _ in spans)).total_seconds()
    busy = sum((end - start).total_seconds() for start, end in spans)
    return round(100 * busy / (slots * span), 1) if span > 0 else None
