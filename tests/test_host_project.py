"""A brand-new Django project takes the app the way the docs say, from the wheel.

`django-admin startproject` in a temporary folder; the wheel built from this repo
installed into an environment of its own (the suite's dependencies seen through a
`.pth` file, never the repo's code: `capabilities.__file__` is checked); the project
configured with the blocks of docs/operating.md#a-project-of-your-own, copied from
the page; an app `reports` whose `abp_capabilities.py` is the tutorial's, copied from
docs/your-capabilities.md. Then its own Redis, one Celery worker and Daphne, and the
tutorial's `reports.squares` through the Python client and over MCP: in the manifest
with its generated schemas, progress seen, cancelled mid-run, and its work stopped.

The worker has one child, so a call that finishes after a cancelled one proves the
cancelled one's loop is over: had it not stopped, it would have run to its end and
saved its whole CSV first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from abp_jobs_client import CallCancelled, Client, Progress

from tests.support.mcp_clients import official_client
from tests.support.stack import ROOT, ManagedProcess, free_port, port_open, redis_server_binary
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.integration

DOCS = ROOT / "docs"
ROWS = 5000  # 25 s of the tutorial's work: always cancelled long before its end
FILE_BLOCK = re.compile(r"```python\n# (mysite/[\w.]+|reports/[\w.]+)([^\n]*)\n(.*?)```", re.S)


def documented_files() -> dict[str, tuple[str, str]]:
    """Every block the docs head with a file name: name -> (how, code)."""
    text = (DOCS / "operating.md").read_text() + (DOCS / "your-capabilities.md").read_text()
    found = {name: (how.strip(" ,"), code) for name, how, code in FILE_BLOCK.findall(text)}
    assert {
        "mysite/settings.py",
        "mysite/urls.py",
        "mysite/asgi.py",
        "mysite/celery.py",
        "mysite/__init__.py",
        "reports/abp_capabilities.py",
    } <= set(found)
    return found


class HostProcess(ManagedProcess):
    """A process of the host project: started in its folder, with only its environment."""

    def __init__(self, name: str, args: list[str], host: Path, env: dict[str, str]) -> None:
        super().__init__(name, args, host / "logs", env, inherit=False)
        self.cwd = host / "project"

    def launch(self) -> None:
        # Its own folder first on sys.path (python -m), never the repo's.
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )


@dataclass(frozen=True)
class Host:
    """The running host project."""

    folder: Path
    python: Path
    web_port: int
    key: str

    @property
    def project(self) -> Path:
        return self.folder / "project"

    def job(self, call_id: str) -> dict[str, Any] | None:
        """The job row of a call, read from the host's own database."""
        with sqlite3.connect(self.project / "db.sqlite3", timeout=20) as db:
            db.row_factory = sqlite3.Row
            row = db.execute(
                "SELECT status, cancel_source, stopped_at, hard_killed, progress, progress_total"
                " FROM capabilities_job WHERE call_id = ? AND capability = 'reports.squares'",
                (call_id,),
            ).fetchone()
        return dict(row) if row is not None else None

    def saved_reports(self) -> list[bytes]:
        """Every squares.csv the capability saved."""
        return [path.read_bytes() for path in (self.project / "media").rglob("squares.csv")]


def run(python: Path, *args: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(into: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the repo's packaging (no build/ left in the repo)."""
    source = into / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "capabilities", source / "capabilities", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = into / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("abp_jobs-*.whl")
    return wheel


def host_environment(folder: Path) -> Path:
    """A venv with the wheel installed; the suite's dependencies through a `.pth` file.

    Lines of a `.pth` file only add folders: the repo's own editable install (a finder
    that a `.pth` of the suite's site-packages starts) is never loaded there.
    """
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = build_wheel(folder)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         str(wheel)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return python


def write_project(python: Path, folder: Path, redis_url: str, env: dict[str, str]) -> None:
    """startproject, then the documented blocks: settings appended, other files as shown."""
    project = folder / "project"
    project.mkdir()
    run(python, "-m", "django", "startproject", "mysite", str(project), cwd=folder, env=env)
    (project / "reports").mkdir()
    (project / "reports" / "__init__.py").write_text("")
    for name, (how, code) in documented_files().items():
        if name == "mysite/settings.py":
            assert how == "at the end"
            assert 'REDIS_URL = "redis://127.0.0.1:6379/0"' in code
            with (project / name).open("a") as settings:
                settings.write("\n" + code.replace("redis://127.0.0.1:6379/0", redis_url))
        else:
            assert how == ""
            (project / name).write_text(code)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("host-project")
    (folder / "logs").mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(folder)),
        "PYTHONUNBUFFERED": "1",
    }
    python = host_environment(folder)
    redis_port, web_port = free_port(), free_port()
    write_project(python, folder, f"redis://127.0.0.1:{redis_port}/0", env)
    project = folder / "project"
    where = run(python, "-c", "import capabilities; print(capabilities.__file__)", cwd=project,
                env=env)  # fmt: skip
    assert Path(where.strip()).is_relative_to(folder / "venv"), where
    run(python, "manage.py", "migrate", "--noinput", cwd=project, env=env)
    key = run(python, "manage.py", "create_agent_key", "host-test", "--quiet", cwd=project, env=env)
    processes = [
        HostProcess(
            "redis",
            [redis_server_binary(), "--port", str(redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(folder)],
            folder,
            env,
        ),
        # Both queues, one child: jobs run one after the other (the module's docstring).
        HostProcess(
            "worker",
            [str(python), "-m", "celery", "-A", "mysite", "worker", "-Q", "abp.heavy,abp.small",
             "-P", "prefork", "-c", "1", "--prefetch-multiplier", "1", "-n", "host@%h",
             "--without-gossip", "--without-mingle", "-l", "info"],
            folder,
            env,
        ),
        HostProcess(
            "daphne",
            [str(python), "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port),
             "mysite.asgi:application"],
            folder,
            env,
        ),
    ]  # fmt: skip
    redis, worker, daphne = processes
    try:
        redis.start(lambda: port_open(redis_port))
        worker.start(lambda: " ready." in worker.log_text())
        daphne.start(lambda: port_open(web_port))
        yield Host(folder, python, web_port, key.strip())
    finally:
        for process in reversed(processes):
            process.stop()
        for process in processes:
            print(f"--- {process.name}\n{process.tail(60)}")


def manifest(host: Host) -> dict[str, Any]:
    url = f"http://127.0.0.1:{host.web_port}/abp.json"
    with urllib.request.urlopen(url, timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return document


def squares_available(host: Host) -> dict[str, Any] | None:
    entries = {entry["name"]: entry for entry in manifest(host)["capabilities"]}
    entry = entries.get("reports.squares")
    return entry if entry is not None and entry.get("available", True) else None


def test_the_manifest_lists_the_tutorial_capability_with_its_generated_schemas(
    host: Host,
) -> None:
    entry = eventually(lambda: squares_available(host), timeout=30)
    document = manifest(host)
    # The project's partial ABP, over the app's defaults.
    assert document["app"]["name"] == "My reports"
    assert entry["description"] == "A CSV of n and n squared, one row at a time."
    params = entry["inputSchema"]
    assert params["type"] == "object"
    assert params["properties"]["rows"]["type"] == "integer"
    assert params["properties"]["title"]["type"] == "string"
    result = entry["outputSchema"]
    assert set(result["properties"]) == {"rows", "csv"}
    assert set(result.get("required", [])) == {"rows", "csv"}


def cancelled_and_stopped(host: Host, call_id: str) -> dict[str, Any] | None:
    job = host.job(call_id)
    return job if job is not None and job["stopped_at"] is not None else None


def finish_one_more(host: Host) -> None:
    """A short call to its end on the worker's one child: every earlier job has ended."""
    with Client(f"ws://127.0.0.1:{host.web_port}/abp/ws", key=host.key) as client:
        result = client.call("reports.squares", {"rows": 3, "title": "After"})
    assert result.data["rows"] == 3


def assert_work_stopped(host: Host, call_id: str) -> None:
    """Stopped at a checkpoint (no kill), and its CSV never saved: the loop ended early."""
    job = eventually(lambda: cancelled_and_stopped(host, call_id), timeout=30)
    assert job["status"] == "cancelled"
    assert job["cancel_source"] == "agent"
    assert not job["hard_killed"]
    finish_one_more(host)
    saved = host.saved_reports()
    assert saved  # the call that finished saved its file where we look
    assert all(data.count(b"\n") < ROWS for data in saved)


def test_the_python_client_sees_progress_cancels_mid_run_and_the_work_stops(
    host: Host,
) -> None:
    eventually(lambda: squares_available(host), timeout=30)
    seen: list[Progress] = []
    with Client(f"ws://127.0.0.1:{host.web_port}/abp/ws", key=host.key) as client:
        handle = client.start(
            "reports.squares", {"rows": ROWS}, on_progress=seen.append, call_id="client-1"
        )
        eventually(lambda: [p for p in seen if (p.progress or 0) >= 200], timeout=30)
        confirmation = handle.cancel("changed my mind")
        assert confirmation["cancelled"] is True
        with pytest.raises(CallCancelled):
            handle.result(timeout=30)
    assert all(p.total == ROWS for p in seen if p.stage == "rows")
    assert_work_stopped(host, "client-1")


def test_an_mcp_client_sees_progress_cancels_mid_run_and_the_work_stops(host: Host) -> None:
    eventually(lambda: squares_available(host), timeout=30)
    reports: list[float] = []
    outcome: dict[str, Any] = {}

    async def scenario() -> None:
        rows_seen = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reports.append(progress)
            if progress >= 200:
                rows_seen.set()

        url = f"http://127.0.0.1:{host.web_port}/mcp"
        async with official_client(url, key=host.key, mode="legacy") as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert tools["reports.squares"].input_schema["properties"]["rows"]["type"] == (
                "integer"
            )
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    outcome["result"] = await client.call_tool(
                        "reports.squares", {"rows": ROWS}, progress_callback=on_progress
                    )

                group.start_soon(call)
                with anyio.fail_after(30):
                    await rows_seen.wait()
                group.cancel_scope.cancel()
            # The session stays open until the cancel has landed (else a disconnect).
            await eventually_async(lambda: mcp_job_cancelled(host))

    anyio.run(scenario)
    assert "result" not in outcome
    assert reports == sorted(set(reports))
    (call_id,) = outcome_call_ids(host)
    assert_work_stopped(host, call_id)


def mcp_calls(host: Host) -> list[dict[str, Any]]:
    with sqlite3.connect(host.project / "db.sqlite3", timeout=20) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT job.call_id, job.status FROM capabilities_job AS job"
            " JOIN capabilities_agentsession AS session ON job.session_id = session.id"
            " WHERE session.door = 'mcp' AND job.capability = 'reports.squares'"
        ).fetchall()
    return [dict(row) for row in rows]


def mcp_job_cancelled(host: Host) -> bool:
    return any(row["status"] == "cancelled" for row in mcp_calls(host))


def outcome_call_ids(host: Host) -> list[str]:
    return [row["call_id"] for row in mcp_calls(host) if row["status"] == "cancelled"]
