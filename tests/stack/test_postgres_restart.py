"""PostgreSQL restarts under the deployment's processes: the next calls still run.

A private PostgreSQL cluster (tests/support/postgres_server.py) under one Daphne and
one node's workers; it is restarted between calls, so every process holds a
connection the restart broke. Celery keeps a task's connection for the next
(CELERY_DB_REUSE_MAX), so a worker must check it before using it, or every later task
fails before its job starts (found by the soak, docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import fleet, postgres_server
from tests.support.agent import Agent
from tests.support.topology import Topology

HEAVY = {"steps": 5, "stepMs": 20, "echo": "heavy"}
SMALL = {"markdown": "# small"}


def answered(agent: Agent, capability: str, params: dict[str, Any], call_id: str) -> bool:
    """Whether the call succeeds, made again (a new callId) after a retryable refusal.

    The web process's own connection may be the broken one: its first call after the
    restart is refused, retryable ("could not be queued; try again"), as documented.
    """
    for attempt in range(3):
        message_id = agent.call(capability, params, call_id=f"{call_id}-{attempt}")
        payload = agent.result_of(message_id, timeout=30)["payload"]
        if payload["success"]:
            return True
        assert payload["error"]["retryable"], payload
    return False


def heavy_and_small(agent: Agent, tag: str) -> list[bool]:
    """A call on each queue's worker (test.sleep: heavy; markdown: small), answered."""
    return [
        answered(agent, "test.sleep", {**HEAVY, "echo": tag}, f"heavy-{tag}"),
        answered(agent, "convert.markdownToHtml", SMALL, f"small-{tag}"),
    ]


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_calls_run_after_postgresql_restarts_under_the_workers(tmp_path: Path) -> None:
    missing = postgres_server.available()
    if missing:
        pytest.fail(missing)
    server = postgres_server.PostgresServer()
    server.init()
    server.start()
    try:
        # Small calls go to the small worker, not the Daphne's own lane.
        settings = {**fleet.SETTINGS, "ABP_LOCAL_LANE_PROCESSES": "0"}
        topology = Topology(
            "pgrestart", tmp_path / "run", settings, webs=1, nodes=("node1",),
            database_server=server.url,
        )  # fmt: skip
        with topology.running():
            key = topology.create_key("postgres restart test")
            with Agent(topology.webs[0].ws_url, key=key) as agent:
                agent.initialize()
                assert heavy_and_small(agent, "before") == [True, True]
                for mode in ("fast", "immediate"):
                    server.restart(mode)
                    assert heavy_and_small(agent, mode) == [True, True]
                # A run the restart falls in the middle of: its progress writes fail,
                # the work goes on, and its end is written once the server is back.
                across = {"steps": 150, "stepMs": 20, "echo": "across"}
                message_id = agent.call("test.sleep", across, progress_token="across")
                agent.wait_for(lambda e: e["type"] == "progress", timeout=30)
                server.restart("immediate")
                result = agent.result_of(message_id, timeout=60)["payload"]
                assert result["success"] is True, result
                assert result["data"]["echo"] == "across"
    finally:
        server.remove()
