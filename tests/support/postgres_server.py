"""A private PostgreSQL 15 cluster on a free port, which a test may stop, restart or kill.

The soak (bench/soak.py) restarts PostgreSQL under load; the machine's shared server
is never touched. `initdb` refuses to run as root, so as root every command runs as
the `postgres` system user (`runuser -u postgres --`) in a directory that user owns.
Only loopback TCP is served (no Unix socket), with `trust` authentication; `fsync` is
off: the faults here kill processes, never the machine, so nothing written is lost.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.stack import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
SYSTEM_USER = "postgres"


def available() -> str | None:
    """None if a private cluster can be made here; else why not."""
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL 15 binaries in {BIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            return f"running as root and there is no `{SYSTEM_USER}` user to run initdb as"
    return None


class PostgresServer:
    """`initdb` in a temporary directory, then `pg_ctl` to start, stop and restart it."""

    def __init__(self, base: Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="abp-pg-", dir=base))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            user = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.dir, user.pw_uid, user.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> str:
        """A PostgreSQL program, as the `postgres` user when we are root."""
        command = [str(BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SYSTEM_USER, "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.dir
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def init(self) -> None:
        """Create the cluster (once)."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _options(self) -> str:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "''",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "300",
        }
        return " ".join(f"-c {name}={value}" for name, value in settings.items())

    def start(self) -> None:
        """Start it and wait until it takes connections."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-o", self._options(),
            "-w", "-t", "60", "start",
        )  # fmt: skip
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        """Stop it (`fast`: roll back and disconnect every session; `immediate`: no checkpoint)."""
        if self.pid() is not None:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop, then start again."""
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster; its backends exit on their own. Start it to recover."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
        # Backends outlive their postmaster for a moment; a new one waits for them.
        (self.data / "postmaster.pid").unlink(missing_ok=True)

    def pid(self) -> int | None:
        """The postmaster's PID, if it runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def wait_ready(self, timeout: float = 60) -> None:
        """Until a connection succeeds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as connection:
                    connection.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def remove(self) -> None:
        """Stop it (immediately) and delete its directory."""
        try:
            self.stop("immediate")
        except RuntimeError:
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
