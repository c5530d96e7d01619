"""MCP Inspector's CLI against /mcp: runs that never end their session, and its load test.

Each `--cli` run opens an MCP session, makes its call and exits without a DELETE,
so its session stays open on the server until the idle timeout: sixteen such runs
once locked a key out of every door. The package comes from the committed lock
file (`make test` runs `npm ci` in tests/mcp_inspector/).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from capabilities.access import agent_keys
from capabilities.models import AgentSession, Door
from tests.support.agent import Agent
from tests.support.node_scripts import node_for
from tests.support.paths import TESTS
from tests.support.rpc_agent import RpcAgent, rpc_url
from tests.support.stack import Stack

pytestmark = pytest.mark.usefixtures("database")

PACKAGE = TESTS / "mcp_inspector"
LAUNCHER = "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
MARKDOWN = {"markdown": "# Hi"}
BOUND = 3


@pytest.fixture(scope="module")
def node() -> str:
    return node_for(PACKAGE, "@modelcontextprotocol/inspector")


def inspector(node: str, stack: Stack, key: str, home: Path, *options: str) -> dict[str, Any]:
    """One `mcp-inspector --cli` run against the stack's /mcp; its JSON output."""
    command = [
        node,
        LAUNCHER,
        "--cli",
        f"{stack.http_url}/mcp",
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {key}",
        "--format",
        "json",
        "--quiet",
        *options,
    ]
    # Its catalog and client config go to a folder of the test's, not the user's.
    env = {
        **os.environ,
        "HOME": str(home),
        "MCP_CATALOG_PATH": str(home / "mcp.json"),
        "MCP_CLIENT_CONFIG_PATH": str(home / "client.json"),
    }
    done = subprocess.run(
        command, cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("era", ["legacy", "auto"])
def test_runs_that_never_end_their_session_lock_no_one_out(
    node: str, stack: Stack, tmp_path: Path, era: str
) -> None:
    key, plaintext = agent_keys.create_key(f"inspector {era}", max_open_sessions=BOUND)
    call = ["--method", "tools/call", "--tool-name", "convert.markdownToHtml"]
    for _ in range(3 * BOUND):
        result = inspector(
            node, stack, plaintext, tmp_path, "--protocol-era", era, *call,
            "--tool-args-json", json.dumps(MARKDOWN),
        )  # fmt: skip
        assert result["result"]["isError"] is False, result
        assert result["result"]["structuredContent"] == {"html": "<h1>Hi</h1>"}
    open_rows = AgentSession.objects.filter(
        principal=f"key:{key.prefix}", door=Door.MCP, closed_at=None, per_call=False
    )
    assert open_rows.count() <= BOUND
    # Every door still lets the key in.
    ws = f"ws://{stack.http_url.removeprefix('http://')}/abp/ws"
    with Agent(ws, key=plaintext) as agent, RpcAgent(rpc_url(ws), key=plaintext) as rpc:
        assert "error" not in agent.initialize()["payload"]
        rpc.start()
        rpc.result(rpc.call("convert.markdownToHtml", MARKDOWN))


def test_its_load_test_of_a_hundred_modern_calls_fifty_at_once_has_no_errors(
    node: str, stack: Stack, tmp_path: Path
) -> None:
    _, plaintext = agent_keys.create_key("inspector load", max_open_sessions=BOUND)
    summary = inspector(
        node, stack, plaintext, tmp_path, "--protocol-era", "modern",
        "--method", "tools/call", "--tool-name", "convert.markdownToHtml",
        "--tool-args-json", json.dumps(MARKDOWN),
        "--load", "--load-concurrency", "50", "--load-requests", "100",
    )  # fmt: skip
    load = summary["result"]
    counts = (load["requests"], load["ok"], load["toolErrors"], load["errors"])
    assert counts == (100, 100, 0, 0), load
