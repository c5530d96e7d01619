"""Production settings end to end, with the deployment's own commands, on PostgreSQL.

Every deployment file starts the service through one script, `scripts/serve ROLE`: the
Procfile (`make run`), the Dockerfile's CMD and each app service of docker-compose.yml.
The first tests (no database) check that they do, what the script's web role runs, and
the compose file's nodes and proxy. The stack tests (marked `postgres`) run what
docker-compose.yml runs (`scripts/serve migrate`, then `worker`, `small`, `beat` and
`web`, each read from the compose file) with the environment of its `x-app` anchor,
filled in as an operator's .env would (a strong secret key, an allowed host and origin),
only the containers' addresses replaced by this box's: a PostgreSQL database of its
own, a private Redis, a temporary media root, Daphne on 127.0.0.1. Through it:
strangers are refused (no key, a wrong key, a foreign Origin, a Host outside the allowed
ones), DEBUG is off, and an agent with a real key makes a call and a cancel.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import postgres
from tests.support.agent import Agent
from tests.support.topology import ROOT, SERVICES, Topology, compose

SERVE = "scripts/serve"
# What an operator puts in .env (or the shell) for docker compose.
OPERATOR = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
    "DJANGO_ALLOWED_HOSTS": "localhost",
    "ABP_ALLOWED_ORIGINS": "https://jobs.example.com",
}
PAGES = "".join(
    f"<section style='page-break-after: always'><h1>Page {n}</h1>{'<p>text</p>' * 30}</section>"
    for n in range(300)
)
VARIABLE = re.compile(r"\$\$|\$\{([A-Z0-9_]+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, variables: dict[str, str]) -> str:
    """docker compose's `${NAME}`, `${NAME:-default}`, `${NAME:?error}` and `$$`."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name, operator, word = match[1], match[2], match[3]
        given = variables.get(name)
        empty = given is None or (given == "" and operator is not None and ":" in operator)
        if not empty:
            assert given is not None
            return given
        if operator and operator.endswith("?"):
            raise AssertionError(f"compose requires {name}: {word}")
        return word or ""

    return VARIABLE.sub(one, value)


def compose_environment(variables: dict[str, str]) -> dict[str, str]:
    """The app services' environment (the `x-app` anchor), filled in from `variables`."""
    raw: dict[str, Any] = compose()["x-app"]["environment"]
    return {name: interpolate(str(value), variables) for name, value in raw.items()}


def procfile() -> dict[str, str]:
    """The Procfile's process types and their command lines."""
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def dockerfile_cmd() -> list[str]:
    """The Dockerfile's CMD (exec form)."""
    match = re.search(r"^CMD (\[.+\])$", (ROOT / "Dockerfile").read_text(), re.M)
    assert match is not None
    cmd: list[str] = json.loads(match[1])
    return cmd


def uncommented(path: Path) -> str:
    """A file without its comment lines."""
    return "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    )


# -- the commands: one script ----------------------------------------------------------


def test_every_deployment_file_starts_the_same_commands() -> None:
    services = compose()["services"]
    for role, service in SERVICES.items():
        assert services[service]["command"] == [SERVE, role], service
    # Every service built from the project's image runs the script.
    built = {name for name, service in services.items() if "build" in service}
    assert built == set(SERVICES.values())
    assert dockerfile_cmd() == [SERVE, "web"] == services["web"]["command"]
    assert procfile() == {
        "web": f"exec {SERVE} web",
        "redis": "exec scripts/redis-server",  # make run's own Redis
        "worker": f"exec {SERVE} worker",
        "small": f"exec {SERVE} small",
        "beat": f"exec {SERVE} beat",
    }
    # Nobody starts Daphne or Celery another way.
    for name in ("Procfile", "Dockerfile", "docker-compose.yml"):
        text = uncommented(ROOT / name)
        assert not re.search(r"\b(daphne|celery)\b", text), name
    # This module's stack and tests/stack/test_multi_node.py run topology.command(role): these.
    assert (ROOT / SERVE).stat().st_mode & 0o111


def test_the_web_role_checks_first_and_passes_the_frame_limit() -> None:
    script = (ROOT / SERVE).read_text()
    web = script[script.index("\n  web)") : script.index(";;", script.index("\n  web)"))]
    assert web.index("python manage.py check\n") < web.index("exec daphne ")
    assert web.rstrip().endswith(" abpsite.asgi:application")
    flags = dict(re.findall(r"(--websocket-max-(?:message|frame)-size) (\S+)", web))
    assert flags == {
        "--websocket-max-message-size": '"$frame_bytes"',
        "--websocket-max-frame-size": '"$frame_bytes"',
    }
    default = re.search(r"^#ABP_MAX_FRAME_BYTES=(\d+)$", (ROOT / ".env.example").read_text(), re.M)
    assert default is not None
    assert int(default[1]) == 16 * 1024 * 1024  # settings.py's default
    assert f'frame_bytes="${{ABP_MAX_FRAME_BYTES:-{default[1]}}}"' in script
    # The containers get the variable too (the settings read it for the embed bridge).
    assert (
        compose()["x-app"]["environment"]["ABP_MAX_FRAME_BYTES"]
        == "${ABP_MAX_FRAME_BYTES:-16777216}"
    )


def test_compose_runs_web_and_workers_on_several_nodes_behind_a_proxy() -> None:
    services = compose()["services"]
    replicas = {
        name: interpolate(str(services[name]["deploy"]["replicas"]), {})
        for name in ("web", "worker", "worker-small", "beat")
    }
    assert int(replicas["web"]) >= 2
    assert int(replicas["worker"]) >= 2
    assert int(replicas["worker-small"]) >= 2
    assert replicas["beat"] == "1"
    assert "ports" not in services["web"]  # reached through the proxy only
    liveness = " ".join(services["web"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/healthz" in liveness
    proxy = services["proxy"]
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in proxy["volumes"]
    address = proxy["networks"]["default"]["ipv4_address"]
    trusted = compose_environment(OPERATOR)["ABP_TRUSTED_PROXIES"]
    assert trusted == address
    config = (ROOT / "deploy" / "haproxy.cfg").read_text()
    for line in (
        "http-check send meth GET uri /readyz?exclude=workers,database,redis ver HTTP/1.1"
        " hdr Host 127.0.0.1",
        "balance leastconn",
        "stick store-response res.hdr(Mcp-Session-Id)",
        "stick match req.hdr(Mcp-Session-Id)",
        "timeout tunnel 1h",
        "option forwardfor",
        "server-template web 10 web:8000",
    ):
        assert line in config
    haproxy = shutil.which("haproxy")
    if haproxy:  # Debian's haproxy, when installed: the config parses
        checked = subprocess.run(
            [haproxy, "-c", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


# -- the stack, with production settings -----------------------------------------------


class Production:
    """The running stack, the key made for it, and where to reach it."""

    def __init__(self, topology: Topology, key: str) -> None:
        self.topology = topology
        self.key = key
        web = topology.webs[0]
        self.ws_url = web.ws_url  # ws://localhost:PORT: a host the settings allow
        self.http_url = web.http_url
        self.port = web.port

    def job(self, call_id: str) -> dict[str, Any] | None:
        """The job row of a callId (one session per callId in these tests)."""
        rows = self.topology.database.query(
            "SELECT status, error_code, worker, cancel_source, stopped_at IS NOT NULL"
            " FROM capabilities_job WHERE call_id = %s",
            (call_id,),
        )
        if not rows:
            return None
        names = ("status", "error_code", "worker", "cancel_source", "stopped")
        return dict(zip(names, rows[0], strict=True))

    def wait_job(self, call_id: str, **expected: Any) -> dict[str, Any]:
        """The job row once its fields have the expected values."""
        deadline = time.monotonic() + 20
        while True:
            job = self.job(call_id)
            if job and all(job[name] == value for name, value in expected.items()):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"{call_id}: {job}, expected {expected}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Production]:
    """The compose file's processes and environment on this box."""
    unreachable = postgres.reachable()
    if unreachable:
        pytest.fail(unreachable)
    settings = compose_environment(OPERATOR)
    # What the compose file says, before this box's addresses replace the containers'.
    assert settings["DJANGO_ENV"] == "production"
    assert settings["DATABASE_URL"].startswith("postgres://")
    assert settings["ABP_ALLOWED_ORIGINS"] == OPERATOR["ABP_ALLOWED_ORIGINS"]
    assert settings["DJANGO_ALLOWED_HOSTS"] == OPERATOR["DJANGO_ALLOWED_HOSTS"]
    assert not {"DJANGO_DEBUG", "ABP_ALLOW_ANONYMOUS", "DJANGO_SETTINGS_MODULE"} & set(settings)
    run_dir = tmp_path_factory.mktemp("production")
    # DATABASE_URL, REDIS_URL and DJANGO_MEDIA_ROOT are replaced by the topology's.
    topology = Topology(
        "production", run_dir, settings, webs=1, nodes=("prod",), web_host="localhost"
    )
    artifacts = Path(os.environ.get("ABP_TEST_ARTIFACTS", ROOT / "var" / "test-artifacts"))
    with topology.running(artifacts / "production-stack"):
        deploy_check = subprocess.run(
            [str(Path(topology.env["PATH"].split(":")[0]) / "python"), "manage.py", "check",
             "--deploy", "--fail-level", "ERROR"],
            cwd=ROOT, env=topology.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert deploy_check.returncode == 0, deploy_check.stderr
        yield Production(topology, topology.create_key("production e2e"))


def refusal(agent: Agent) -> tuple[str, int]:
    """The reason a refused connection is told, and its close code."""
    note = agent.wait_for(lambda e: e["type"] == "notification")
    with pytest.raises(ConnectionClosed) as closed:
        agent.receive(timeout=5)
    assert closed.value.rcvd is not None
    return note["payload"]["data"]["details"]["reason"], closed.value.rcvd.code


@pytest.mark.postgres
def test_strangers_are_refused_and_debug_is_off(production: Production) -> None:
    with Agent(production.ws_url, key=None) as anonymous:
        assert refusal(anonymous) == ("missing-credentials", 4401)
    with Agent(production.ws_url, key="abp_" + secrets.token_urlsafe(30)) as guesser:
        assert refusal(guesser) == ("invalid-credentials", 4401)
    with pytest.raises(InvalidStatus) as foreign:
        Agent(
            production.ws_url,
            key=production.key,
            additional_headers={"Origin": "https://evil.example"},
        )
    assert foreign.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as wrong_host:
        Agent(f"ws://127.0.0.1:{production.port}/abp/ws", key=production.key)
    assert wrong_host.value.response.status_code == 403
    # No debug page: a plain 404, and a Host outside DJANGO_ALLOWED_HOSTS a plain 400.
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{production.http_url}/no-such-page/", timeout=10)
    body = missing.value.read().decode()
    assert missing.value.code == 404
    assert "URLconf" not in body
    assert "DEBUG = True" not in body
    with pytest.raises(urllib.error.HTTPError) as bad_host:
        urllib.request.urlopen(f"http://127.0.0.1:{production.port}/abp.json", timeout=10)
    assert bad_host.value.code == 400
    assert "DisallowedHost" not in bad_host.value.read().decode()
    # The product's capabilities only (no test settings).
    with urllib.request.urlopen(f"{production.http_url}/abp.json", timeout=10) as manifest:
        names = {c["name"] for c in json.loads(manifest.read())["capabilities"]}
    assert names == {"convert.markdownToHtml", "export.pdf", "process.image"}


@pytest.mark.postgres
def test_a_call_and_a_cancel_through_the_production_stack(production: Production) -> None:
    origin = {"Origin": OPERATOR["ABP_ALLOWED_ORIGINS"]}
    with Agent(production.ws_url, key=production.key, additional_headers=origin) as agent:
        agent.initialize(name="production-e2e")
        call = agent.call(
            "convert.markdownToHtml", {"markdown": "# Hello *prod*"}, call_id="prod-md"
        )
        result = agent.result_of(call, timeout=30)["payload"]
        assert result["success"] is True
        assert result["data"]["html"].startswith("<h1>Hello <em>prod</em></h1>")
        # Too large for the local lane: the small queue's worker runs it.
        large = {"markdown": "# Large\n\n" + "word " * 20_000}
        large_call = agent.call("convert.markdownToHtml", large, call_id="prod-md-large")
        assert agent.result_of(large_call, timeout=30)["payload"]["success"] is True

        export = agent.call("export.pdf", {"html": PAGES}, call_id="prod-pdf")
        production.wait_job("prod-pdf", status="running")
        cancel = agent.reply_to(agent.cancel("prod-pdf"), "capabilities/cancel-result")
        assert cancel["payload"]["cancelled"] is True
        cancelled = agent.result_of(export, timeout=30)["payload"]
        assert cancelled["cancelled"] is True
        assert cancelled["error"]["code"] == "CANCELLED"
        assert len(agent.results_for_call("prod-pdf")) == 1

    done = production.wait_job("prod-md", status="succeeded")
    assert done["worker"].startswith("local@")  # the web process's local lane
    large_done = production.wait_job("prod-md-large", status="succeeded")
    assert large_done["worker"].startswith("small@prod:")
    stopped = production.wait_job("prod-pdf", status="cancelled", stopped=True)
    assert stopped["cancel_source"] == "agent"
    assert stopped["worker"].startswith("heavy@prod:")
