"""The deployment's processes on one box, started with the deployment's own commands.

Every process is `scripts/serve ROLE`, read from docker-compose.yml (the Procfile and
the Dockerfile run the same script; tests/stack/test_production_stack.py checks that), with
an environment of its own: nothing of the test run's (tests/conftest.py points the
suite at SQLite and tests.settings) leaks into it. A `Topology` is a PostgreSQL
database of its own (tests/support/postgres.py), a private Redis, Daphnes on free
ports, Celery workers for each queue on named nodes (`heavy@node1`, `small@node2`...)
and one beat; every process is stopped or killed by its PID.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.postgres import TemporaryDatabase
from tests.support.stack import ManagedProcess, free_port, port_open, redis_server_binary

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
# The compose service that runs each role of scripts/serve.
SERVICES = {
    "migrate": "migrate",
    "web": "web",
    "worker": "worker",
    "small": "worker-small",
    "beat": "beat",
}
# The test run's own settings variables: never passed on to the deployment's processes.
FOREIGN = re.compile(
    r"^(DJANGO_|ABP_|CELERY_|CHANNEL_LAYER_)|^(DATABASE_URL|REDIS_URL|PORT|WEB_BIND|"
    r"WORKER_NODE|WORKER_CONCURRENCY|PYTEST_|COV_)"
)


def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed."""
    parsed: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return parsed


def command(role: str) -> list[str]:
    """The command docker-compose.yml runs for a role (`scripts/serve ROLE`)."""
    service = compose()["services"][SERVICES[role]]
    args = [str(arg) for arg in service["command"]]
    return args


def clean_environment(**values: str) -> dict[str, str]:
    """This process's environment less the test run's settings, the venv first on PATH."""
    env = {name: value for name, value in os.environ.items() if not FOREIGN.match(name)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(values)
    return env


class Process(ManagedProcess):
    """A child process with its log in a file and exactly the environment it is given."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> None:
        super().__init__(name, args, log_dir, dict(env), inherit=False)

    def wait_ready(self, ready: Callable[[], bool], timeout: float = 90.0) -> None:
        """Wait until `ready()`, failing if it exits first (a node starts slower here)."""
        super().wait_ready(ready, timeout)


@dataclass
class Web:
    """A Daphne and where it listens."""

    process: Process
    port: int
    host: str = "127.0.0.1"

    @property
    def ws_url(self) -> str:
        """Its ABP WebSocket."""
        return f"ws://{self.host}:{self.port}/abp/ws"

    @property
    def http_url(self) -> str:
        """Its root."""
        return f"http://{self.host}:{self.port}"


def worker_ready(process: Process) -> Callable[[], bool]:
    """Celery logs ` ready.` once it consumes."""
    return lambda: " ready." in process.log_text()


def warm(port: int) -> bool:
    """Whether the Daphne at `port` is ready but for live workers (/readyz)."""
    url = f"http://127.0.0.1:{port}/readyz?exclude=workers"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Topology:
    """PostgreSQL, Redis, Daphnes, a heavy and a small worker per node, one beat."""

    def __init__(
        self,
        purpose: str,
        run_dir: Path,
        settings: Mapping[str, str],
        *,
        webs: int = 2,
        nodes: tuple[str, ...] = ("node1", "node2"),
        heavy_concurrency: int = 2,
        web_host: str = "127.0.0.1",
        database_server: str | None = None,
    ) -> None:
        """`database_server`: the PostgreSQL server to create the database on (a URL to
        one of its databases; default TEST_DATABASE_URL's, tests/support/postgres.py)."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.database = TemporaryDatabase(purpose, database_server)
        self.redis_port = free_port()
        # This box's addresses in place of any the settings name (a compose file's).
        here = {
            "DATABASE_URL": self.database.url,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "DJANGO_MEDIA_ROOT": str(run_dir / "media"),
            "CELERY_BEAT_SCHEDULE_FILE": str(run_dir / "beat-schedule"),
        }
        self.env = clean_environment(**{**settings, **here})
        self.redis = Process(
            "redis",
            [
                redis_server_binary(),
                "--port", str(self.redis_port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(run_dir),
            ],
            self.env,
            run_dir,
        )  # fmt: skip
        self.workers: dict[str, Process] = {}
        for node in nodes:
            for role, queue in (("worker", "heavy"), ("small", "small")):
                env = {**self.env, "WORKER_NODE": node}
                if role == "worker":
                    env["WORKER_CONCURRENCY"] = str(heavy_concurrency)
                name = f"{queue}@{node}"
                self.workers[name] = Process(name, command(role), env, run_dir)
        self.beat = Process("beat", command("beat"), self.env, run_dir)
        self.webs: list[Web] = []
        for index in range(webs):
            port = free_port()
            env = {**self.env, "PORT": str(port), "WEB_BIND": "127.0.0.1"}
            process = Process(f"daphne-{index + 1}", command("web"), env, run_dir)
            self.webs.append(Web(process, port, web_host))
        self._database_created = False

    @property
    def processes(self) -> list[Process]:
        """Every process, in the order they start."""
        return [self.redis, *self.workers.values(), self.beat, *(w.process for w in self.webs)]

    def manage(self, *args: str, timeout: float = 120) -> str:
        """Run a manage.py command with the deployment's environment; its stdout."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stderr}")
        return done.stdout

    def create_key(self, name: str) -> str:
        """A new agent key (its plaintext), made the way an operator makes one."""
        return self.manage("create_agent_key", name, "--quiet").strip()

    def start(self) -> None:
        """Create and migrate the database, then start everything, Redis first."""
        self.database.create()
        self._database_created = True
        self.database.migrate(command("migrate"), self.env)
        self.redis.launch()
        self.redis.wait_ready(lambda: port_open(self.redis_port))
        rest = [*self.workers.values(), self.beat, *(w.process for w in self.webs)]
        for process in rest:
            process.launch()
        for process in self.workers.values():
            process.wait_ready(worker_ready(process))
        self.beat.wait_ready(lambda: "beat: Starting" in self.beat.log_text())
        for web in self.webs:
            web.process.wait_ready(lambda port=web.port: port_open(port))  # type: ignore[misc]
        # Warm, as a proxy's or an orchestrator's readiness check waits for it
        # (capabilities/calls/warm_up.py).
        for web in self.webs:
            web.process.wait_ready(lambda port=web.port: warm(port))  # type: ignore[misc]

    def stop(self) -> None:
        """Stop everything (in parallel, Redis last) and drop the database."""
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: p.stop(), [p for p in self.processes if p is not self.redis]))
        self.redis.stop()
        if self._database_created:
            self.database.drop()

    def keep_logs(self, artifacts: Path) -> None:
        """Copy every process's log to `artifacts`."""
        artifacts.mkdir(parents=True, exist_ok=True)
        for process in self.processes:
            if process.log_path.exists():
                shutil.copyfile(process.log_path, artifacts / process.log_path.name)

    def remove_files(self) -> None:
        """Delete the run's directory (logs, media)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)

    @contextlib.contextmanager
    def running(self, artifacts: Path | None = None) -> Iterator[Topology]:
        """Started for the block; stopped, logs kept and files removed after it."""
        try:
            self.start()
            yield self
        finally:
            self.stop()
            if artifacts is not None:
                self.keep_logs(artifacts)
            self.remove_files()


PROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"


def local_proxy_config(listen_port: int, web_ports: list[int]) -> str:
    """deploy/haproxy.cfg for this box: the same, but for where it finds the replicas.

    Docker's DNS (`resolvers docker`, `server-template web 10 web:8000`) becomes one
    `server` line per local Daphne, and `bind :8080` a loopback port. Everything else
    (balancing, checks, stickiness, timeouts, headers) is the file as shipped; a change
    that breaks these replacements fails here instead of silently testing less.
    """
    text = PROXY_CONFIG.read_text()
    resolvers = re.search(r"^resolvers docker\n(?:    .*\n)+\n", text, re.M)
    assert resolvers is not None, "deploy/haproxy.cfg: no `resolvers docker` section"
    text = text.replace(resolvers[0], "")
    replacements = {
        "    bind :8080\n": f"    bind 127.0.0.1:{listen_port}\n",
        " resolvers docker init-addr none\n": "\n",
        "    server-template web 10 web:8000\n": "".join(
            f"    server web{n} 127.0.0.1:{port}\n" for n, port in enumerate(web_ports, 1)
        ),
    }
    for old, new in replacements.items():
        assert old in text, f"deploy/haproxy.cfg: no {old.strip()!r}"
        text = text.replace(old, new)
    return text
