"""Several nodes on one box, on PostgreSQL: a Daphne and a worker node killed under load.

The topology (tests/support/topology.py) is the deployment's own: every process is
`scripts/serve ROLE` as docker-compose.yml runs it, on a database of its own and a
private Redis: two Daphnes on two ports, `heavy@node1`, `small@node1`, `heavy@node2`,
`small@node2` and one beat. The scenario (tests/support/fleet.py, the same one
bench/multi_node.py runs bigger and prints):

- 1,000 sessions are opened, spread over both Daphnes, and left idle (each Daphne's
  memory per idle session is measured);
- 400 calls go out at random moments over 10 s on random sessions, mostly
  convert.markdownToHtml, some long test.sleep, with random cancels;
- 3 s in, the second Daphne is SIGKILLed by PID: its 500 sessions resume on the first
  (initialize.resume) and send again what they had sent without hearing back;
- then heavy@node2's main process is SIGKILLed by PID while it runs jobs: those jobs
  answer WORKER_LOST, and everything after runs on node1;
- every call gets exactly one call-result across its session's connections, the one its
  job row says; cancels are answered consistently; nothing else arrives.

The figures (memory per idle session, answer rates, counts) are printed and kept in
var/test-artifacts/multi-node/figures.json with the processes' logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support import fleet, postgres
from tests.support.paths import ROOT
from tests.support.stack import free_port, port_open
from tests.support.topology import Process, Topology, local_proxy_config

DEFAULT_ARTIFACTS = ROOT / "var" / "test-artifacts"
ARTIFACTS = Path(os.environ.get("ABP_TEST_ARTIFACTS", DEFAULT_ARTIFACTS)) / "multi-node"
OPTIONS = fleet.Options(sessions=1000, calls=400, window=10.0, idle_seconds=3.0, seed=7)


@pytest.fixture
def enough_open_files() -> None:
    """A socket per session here and in each Daphne (the processes inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * OPTIONS.sessions + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"open-file hard limit {hard} is below {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@pytest.mark.postgres
@pytest.mark.timeout(360)
@pytest.mark.usefixtures("enough_open_files")
def test_a_thousand_sessions_outlive_a_killed_daphne_and_a_killed_worker_node(
    tmp_path: Path,
) -> None:
    unreachable = postgres.reachable()
    if unreachable:
        pytest.fail(unreachable)
    topology = Topology("multinode", tmp_path / "run", fleet.SETTINGS)
    with topology.running(ARTIFACTS):
        key = topology.create_key("multi-node test")
        outcome = asyncio.run(fleet.run_scenario(topology, key, OPTIONS))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "figures.json").write_text(json.dumps(outcome.figures, indent=2))
    print("\n".join(fleet.report_lines(outcome)))

    assert outcome.problems == [], "\n".join(outcome.problems[:30])
    counts = outcome.counts
    # Every call answered exactly once, across the sessions' connections.
    assert counts["calls"] == OPTIONS.calls
    assert counts["answered once"] == OPTIONS.calls
    # The dead Daphne's sessions, and only those, resumed on the other one.
    assert counts["sessions resumed elsewhere"] == OPTIONS.sessions // 2
    assert counts["answered after a resume"] > 0
    # The worker node's jobs answered WORKER_LOST; cancels and the rest went on.
    assert counts["WORKER_LOST"] >= 1
    assert counts["cancelled"] >= 1
    assert counts["succeeded"] >= OPTIONS.calls // 2
    for memory in outcome.memory:
        assert memory.sessions == OPTIONS.sessions // 2
        assert 0 < memory.rss_per_session < 256, memory  # KiB
    assert outcome.figures["answers_per_second"] > 0


def test_the_exactly_once_check_catches_what_it_must() -> None:
    """The checker itself, on made-up answers: every kind of wrong answer is reported."""
    the_fleet = fleet.Fleet(["ws://a/abp/ws", "ws://b/abp/ws"], "key")
    session = fleet.AgentSession(the_fleet, 0, "ws://a/abp/ws")
    session.session_id = "s-0"
    the_fleet.sessions = [session]
    session.connections = [
        fleet.Connection(0, "ws://a/abp/ws", None, lost=True),  # type: ignore[arg-type]
        fleet.Connection(1, "ws://b/abp/ws", None),  # type: ignore[arg-type]
    ]
    session.resumes = [0.1]  # its Daphne died, it resumed
    outcome = fleet.Outcome(fleet.Options(victim_web=0), the_fleet, memory=[])
    outcome.first_call, outcome.worker_killed_at = 1.0, 5.0
    outcome.running_on_victim = ["j-lost"]

    def md(call_id: str, html: str, message_id: str | None = None) -> fleet.Envelope:
        payload = {"callId": call_id, "success": True, "data": {"html": html}}
        return {"type": "capabilities/call-result", "id": message_id or call_id, "payload": payload}

    def error(call_id: str, code: str, message_id: str, **extra: object) -> fleet.Envelope:
        payload = {"callId": call_id, "success": False, "error": {"code": code, **extra}}
        return {"type": "capabilities/call-result", "id": message_id, "payload": payload}

    reuse = {"details": {"path": fleet.CALL_ID_PATH}}
    cases: dict[str, tuple[list[fleet.Envelope], str, str, str | None]] = {
        # callId: (answers, job status, job worker, the problem expected or None)
        "ok": ([md("ok", "<h1>Call ok</h1>")], "succeeded", "small@node1:1", None),
        "sent-again": (
            [md("sent-again", "<h1>Call sent-again</h1>"),
             error("sent-again", "INVALID_PARAMS", "sent-again~1", **reuse)],
            "succeeded", "small@node1:1", None,
        ),
        "twice": (
            [md("twice", "<h1>Call twice</h1>")] * 2, "succeeded", "small@node1:1",
            "2 call-results",
        ),
        "none": ([], "succeeded", "small@node1:1", "0 call-results"),
        "crossed": ([md("crossed", "<h1>Call ok</h1>")], "succeeded", "small@node1:1",
                    "another call's result"),
        "refused-first": (
            [error("refused-first", "INVALID_PARAMS", "refused-first", **reuse)],
            "failed", "small@node1:1", "failed",
        ),
        "lost-elsewhere": (
            [error("lost-elsewhere", "WORKER_LOST", "lost-elsewhere")],
            "failed", "heavy@node1:7", "WORKER_LOST on heavy@node1",
        ),
        "lost": ([error("lost", "WORKER_LOST", "lost")], "failed", "heavy@node2:9", None),
    }  # fmt: skip
    for call_id, (answers, status, worker, _) in cases.items():
        capability = "test.sleep" if call_id.startswith("lost") else "convert.markdownToHtml"
        call = fleet.Call(0, call_id, capability, {}, None)
        call.sends = [fleet.Sent(call_id, 2.0, 0)]
        if call_id == "sent-again":
            call.sends.append(fleet.Sent("sent-again~1", 3.0, 1))
        call.answers = [(2.5, 0, answer) for answer in answers]
        session.calls[call_id] = call
        job_id = "j-lost" if call_id == "lost" else f"j-{call_id}"
        outcome.jobs[("s-0", call_id)] = {
            "id": job_id, "status": status, "error_code": answers[0]["payload"].get(
                "error", {}).get("code", "") if answers else "",
            "worker": worker, "cancel_source": "",
        }  # fmt: skip

    fleet.check(outcome)

    for call_id, (_, _, _, expected) in cases.items():
        found = [p for p in outcome.problems if p.startswith(f"{call_id} (")]
        if expected is None:
            assert found == [], call_id
        else:
            assert any(expected in p for p in found), (call_id, found)
    assert outcome.counts["WORKER_LOST"] == 2


MCP_VERSION = "2025-11-25"


def mcp_post(url: str, message: dict[str, object], **headers: str) -> tuple[int, dict[str, str]]:
    """POST one JSON-RPC message to /mcp; the status and the response's headers."""
    request = urllib.request.Request(
        url,
        data=json.dumps(message).encode(),
        method="POST",
        headers={
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as refused:
        return refused.code, {k.lower(): v for k, v in refused.headers.items()}


def mcp_session(base: str, key: str) -> str:
    """Open an MCP session at `base`/mcp; its Mcp-Session-Id."""
    status, headers = mcp_post(
        f"{base}/mcp",
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": MCP_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "proxy-test", "version": "1"},
            },
        },
        Authorization=f"Bearer {key}",
    )
    assert status == 200, status
    return headers["mcp-session-id"]


def mcp_list(base: str, key: str, session_id: str) -> int:
    """tools/list in an MCP session: its status (404: this replica does not hold it)."""
    status, _ = mcp_post(
        f"{base}/mcp",
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        **{
            "Authorization": f"Bearer {key}",
            "Mcp-Session-Id": session_id,
            "MCP-Protocol-Version": MCP_VERSION,
        },
    )
    return status


def ws_connects(topology: Topology) -> dict[str, int]:
    """WebSocket sessions each Daphne has accepted so far (its access log)."""
    return {
        web.process.name: web.process.log_text().count('"WSCONNECT /abp/ws"')
        for web in topology.webs
    }


async def through_the_proxy(
    topology: Topology, url: str, key: str
) -> tuple[fleet.Fleet, dict[str, int], dict[str, int]]:
    """40 sessions through the proxy, calls before and after one Daphne is killed."""
    agents = fleet.Fleet([url], key)  # one address: the proxy picks the replica
    await agents.open(40)
    spread = ws_connects(topology)
    markdown = {"markdown": "Through the *proxy*."}
    start = time.perf_counter()
    plans = [
        [
            fleet.Planned(0.02 * n, "convert.markdownToHtml", markdown, None),
            fleet.Planned(3.0 + 0.02 * n, "convert.markdownToHtml", markdown, None),
        ]
        for n in range(len(agents.sessions))
    ]
    drivers = [
        asyncio.create_task(s.drive(plan, start))
        for s, plan in zip(agents.sessions, plans, strict=True)
    ]
    await asyncio.sleep(1.5)
    topology.webs[1].process.kill()  # SIGKILL by PID, while calls are in flight
    await asyncio.gather(*drivers)
    for _ in range(600):  # a minute at most
        if all(s.settled() for s in agents.sessions):
            break
        await asyncio.sleep(0.1)
    after = ws_connects(topology)
    await agents.close()
    return agents, spread, after


@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_the_proxy_spreads_sockets_resumes_past_a_dead_replica_and_sticks_mcp(
    tmp_path: Path,
) -> None:
    """deploy/haproxy.cfg as shipped (only Docker's DNS swapped for two local Daphnes)."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is not installed (`make` installs Debian's haproxy as root)")
    unreachable = postgres.reachable()
    if unreachable:
        pytest.fail(unreachable)
    topology = Topology("proxy", tmp_path / "run", fleet.SETTINGS, nodes=("node1",))
    with topology.running(ARTIFACTS / "proxy"):
        port = free_port()
        config = tmp_path / "haproxy.cfg"
        config.write_text(local_proxy_config(port, [web.port for web in topology.webs]))
        proxy = Process("haproxy", [haproxy, "-db", "-f", str(config)], topology.env, tmp_path)
        proxy.launch()
        try:
            proxy.wait_ready(lambda: port_open(port))
            key = topology.create_key("proxy test")
            base = f"http://127.0.0.1:{port}"
            # MCP: a session lives in one Daphne; through the proxy it always reaches it.
            session_id = mcp_session(base, key)
            direct = sorted(mcp_list(web.http_url, key, session_id) for web in topology.webs)
            assert direct == [200, 404]
            assert [mcp_list(base, key, session_id) for _ in range(12)] == [200] * 12
            # WebSockets: spread over both, then one Daphne dies under them.
            agents, spread, after = asyncio.run(
                through_the_proxy(topology, f"ws://127.0.0.1:{port}/abp/ws", key)
            )
        finally:
            proxy.stop()
            (ARTIFACTS / "proxy").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(proxy.log_path, ARTIFACTS / "proxy" / "haproxy.log")
    on_first, on_second = spread["daphne-1"], spread["daphne-2"]
    assert on_first >= 12, spread  # leastconn: about 20 each
    assert on_second >= 12, spread
    assert on_first + on_second == len(agents.sessions)
    # The dead Daphne's sessions, and only those, came back through the proxy to the other.
    assert [s.failure for s in agents.sessions if s.failure] == []
    assert sum(1 for s in agents.sessions if s.resumes) == on_second
    assert after == {"daphne-1": on_first + on_second, "daphne-2": on_second}
    # Every call answered exactly once, across each session's sockets, and successfully;
    # but a call the dead Daphne was running in its own local lane when it was killed
    # (one sent before the kill, on a session that was there) answers WORKER_LOST.
    calls = agents.calls()
    assert len(calls) == 2 * len(agents.sessions)
    for call in calls:
        assert len(call.results) == 1, (call.call_id, call.answers)
        payload = call.results[0][2]["payload"]
        on_the_dead_replica = bool(agents.sessions[call.session].resumes)
        if call.call_id.endswith("-c0") and on_the_dead_replica and not payload["success"]:
            assert payload["error"]["code"] == "WORKER_LOST", call.results
        else:
            assert payload["success"] is True, call.results
