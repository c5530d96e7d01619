"""The soak (bench/soak.py) as CI runs it: three minutes with seed 7, every door and every
kind of fault, on a private PostgreSQL cluster; any violated invariant fails it.

The report (JSON) and every process's log are kept in var/test-artifacts/soak/.
Only the PostgreSQL pass runs it (`postgres` marker); it needs PostgreSQL 15's binaries
(tests/support/postgres_server.py), HAProxy and Chromium.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import postgres_server
from tests.support.soak.faults import Kind
from tests.support.soak.main import run_soak
from tests.support.soak.run import Options

DEFAULT_ARTIFACTS = Path(__file__).parent.parent / "var" / "test-artifacts"
ARTIFACTS = Path(os.environ.get("ABP_TEST_ARTIFACTS", DEFAULT_ARTIFACTS)) / "soak"
OPTIONS = Options(
    minutes=3, seed=7, command="tests/test_soak.py: bench/soak.py --minutes 3 --seed 7"
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
    summary = "\n".join(f"{v.invariant}: {v.detail}" for v in outcome.violations[:20])
    assert outcome.violations == [], f"{len(outcome.violations)} violations:\n{summary}"
