"""The soak (bench/soak.py) as CI runs it: three minutes with seed 7, every door and every
kind of fault, on a private PostgreSQL cluster; any violated invariant fails it.

The report (JSON) and every process's log are kept in var/test-artifacts/soak/.
Only the PostgreSQL pass runs it (`postgres` marker); it needs PostgreSQL 15's binaries
(tests/support/postgres_server.py), HAProxy and Chromium.
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from tests.support import postgres_server
from tests.support.paths import ROOT
from tests.support.soak.faults import Kind, schedule
from tests.support.soak.invariants import check
from tests.support.soak.ledger import Answer, Ledger, Op
from tests.support.soak.main import run_soak
from tests.support.soak.rows import COLUMNS, RowWatch
from tests.support.soak.run import Options

DEFAULT_ARTIFACTS = ROOT / "var" / "test-artifacts"
ARTIFACTS = Path(os.environ.get("ABP_TEST_ARTIFACTS", DEFAULT_ARTIFACTS)) / "soak"
OPTIONS = Options(
    minutes=3, seed=7, command="tests/stack/test_soak.py: bench/soak.py --minutes 3 --seed 7"
)


@pytest.mark.postgres
@pytest.mark.timeout(330)
def test_three_minutes_of_load_and_faults_break_no_invariant() -> None:
    unavailable = postgres_server.available()
    if unavailable:
        pytest.fail(unavailable)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outcome = run_soak(OPTIONS, report_path=ARTIFACTS / "report.json", logs=ARTIFACTS / "logs")
    report = outcome.report

    assert report["harness_errors"] == []
    injected = {kind for kind, entry in report["faults_by_kind"].items() if entry["injected"]}
    assert injected == {kind.value for kind in Kind}
    failed = [f for f in report["faults"] if f["error"]]
    assert failed == []
    for door in ("abp", "rpc", "mcp2025", "mcp2026", "client", "browser"):
        assert report["operations"][door]["answers"] > 0, door
    by_invariant = "\n".join(
        f"  {n} {name}" for name, n in report["violations_by_invariant"].items()
    )
    first = "\n".join(f"  {v.tags}: {v.detail}" for v in outcome.violations[:10])
    assert outcome.violations == [], (
        f"{len(outcome.violations)} violations (report.json has each call's timeline):\n"
        f"{by_invariant}\nfirst:\n{first}"
    )


def test_the_checks_catch_what_they_must() -> None:
    """The invariants themselves, on made-up calls and rows: each kind of wrong is reported."""
    ledger = Ledger()
    rows = RowWatch("postgresql://unused", ledger, retention=150, bound=240)
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def row(tag: str, status: str, **fields: Any) -> tuple[Any, ...]:
        values: dict[str, Any] = {
            "id": f"job-{tag}", "tag": tag, "status": status, "error_code": "",
            "cancel_source": "", "created_at": now - timedelta(seconds=60), "started_at": None,
            "settled_at": None, "stopped_at": None, "deadline": None, "worker": "",
            "session_id": "s",
        }  # fmt: skip
        values.update(fields)
        return (*(values[name] for name in COLUMNS), now)

    def op(tag: str, *answers: str, **fields: Any) -> Op:
        made = Op("abp", tag, "test.sleep", None, None, 1.0, session="s")
        for outcome in answers:
            made.answers.append(Answer(2.0, outcome, {}))
        for name, value in fields.items():
            setattr(made, name, value)
        ledger.ops.append(made)
        return made

    settled = now - timedelta(seconds=30)
    cases = {
        # tag: (the call, its row or None, the invariant expected or None)
        "ok": (op("ok", "succeeded"), row("ok", "succeeded", settled_at=settled), None),
        "told": (op("told", told="resume refused"), None, None),
        "none": (op("none"), None, "answered exactly once"),
        "twice": (op("twice", "succeeded", "succeeded"), None, "answered exactly once"),
        "disagrees": (
            op("disagrees", "succeeded"), row("disagrees", "failed", settled_at=settled),
            "answers agree with their job",
        ),
        "uncalled": (
            op("uncalled", "cancelled"), row("uncalled", "cancelled", settled_at=settled),
            "answers agree with their job",
        ),
        "starved": (
            op("starved", "timeout", timeout_ms=32000, cancelled_at=None),
            row("starved", "cancelled", settled_at=settled), "calls make progress",
        ),
        "late": (
            op("late", "succeeded", late_progress=[9.0]),
            row("late", "succeeded", settled_at=settled), "no work runs for a settled job",
        ),
        "overdue": (
            op("overdue", told="gone"),
            row("overdue", "queued", deadline=now - timedelta(seconds=60)),
            "no job is non-terminal past its deadline plus the grace",
        ),
        "unstopped": (
            op("unstopped", "cancelled", cancelled_at=1.5),
            row("unstopped", "cancelled", started_at=settled, settled_at=settled),
            "no work runs for a settled job",
        ),
        "lost": (
            op("lost", "succeeded"), row("lost", "succeeded", settled_at=settled),
            "no job row is lost or duplicated",
        ),
        "crossed": (
            op("crossed", "succeeded"), row("crossed", "succeeded", settled_at=settled),
            "no answer goes to another session",
        ),
        "old": (
            op("old", "succeeded"), row("old", "succeeded", settled_at=now - timedelta(hours=1)),
            "rows stay bounded by retention",
        ),
    }  # fmt: skip
    rows._observe([r for _, r, _ in cases.values() if r is not None], 5.0)
    rows._observe([r for tag, (_, r, _) in cases.items() if r is not None and tag != "lost"], 8.0)
    cases["crossed"][0].answers[0].data_ok = False
    violations = check(ledger.ops, rows, revoked=set(), strays=["a frame of no call"])

    found: dict[str, set[str]] = {}
    for violation in violations:
        for tag in violation.tags or ["-"]:
            found.setdefault(tag, set()).add(violation.invariant)
    for tag, (_, _, expected) in cases.items():
        if expected is None:
            assert tag not in found, (tag, found.get(tag))
        else:
            assert expected in found.get(tag, set()), (tag, found.get(tag))
    assert "no answer goes to another session" in found["-"]


def test_the_schedule_has_every_kind_or_with_no_rate_nothing() -> None:
    """Every kind of fault at least once, in the window; a rate of 0: a run with none."""
    stack: Any = SimpleNamespace(topology=None)
    targets = {kind: "x" for kind in Kind}
    with mock.patch("tests.support.soak.faults.target_of", lambda kind, *_: targets[kind]):
        faults = schedule(random.Random(2), stack, start=15, end=150, per_minute=4)
        none = schedule(random.Random(2), stack, start=15, end=150, per_minute=0)
    assert {fault.kind for fault in faults} == set(Kind)
    assert len(faults) == len(Kind)  # 9 by the rate, but each kind at least once
    assert all(15 <= fault.at <= 150 for fault in faults)
    assert none == []
