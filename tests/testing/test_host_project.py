"""A brand-new Django project takes the app the way the docs say, from the wheel.

`django-admin startproject` in a temporary folder; the wheel built from this repo
installed into an environment of its own (the suite's dependencies seen through a
`.pth` file, never the repo's code: `capabilities.__file__` is checked); the project
configured with the blocks of docs/operating.md#a-project-of-your-own, copied from
the page; an app `reports` whose `abp_capabilities.py` is the tutorial's, copied from
docs/your-capabilities.md. Then its stack, as `capabilities.testing.live.LiveStack`
starts one for a project's own tests (Redis, one Celery worker, beat and Daphne, in
the project's environment), and the tutorial's `reports.squares` through the Python
client and over MCP: in the manifest with its generated schemas, progress seen,
cancelled mid-run, and its work stopped. Last, the tutorial's own stack tests, its
`conftest.py` with the pytest plugin and its test file, copied from the page into the
project and run there by pytest, each run starting a stack of its own.

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
from abp_jobs_client import CallCancelled, Progress

from capabilities.testing.live import LiveStack
from tests.support.mcp_clients import official_client
from tests.support.stack import ROOT
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.stack

DOCS = ROOT / "docs"
ROWS = 5000  # 25 s of the tutorial's work: always cancelled long before its end
FILE_BLOCK = re.compile(
    r"```python\n# (mysite/[\w.]+|reports/[\w.]+|conftest\.py)([^\n]*)\n(.*?)```", re.S
)
LIVE_TESTS = "reports/test_squares_live.py"


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
        "conftest.py",
        LIVE_TESTS,
    } <= set(found)
    return found


@dataclass(frozen=True)
class Host:
    """The running host project."""

    folder: Path
    python: Path
    env: dict[str, str]
    stack: LiveStack

    @property
    def project(self) -> Path:
        return self.folder / "project"

    def job(self, call_id: str) -> dict[str, Any] | None:
        """The job row of a call, read from the stack's database."""
        assert self.stack.database is not None
        return job_row(self.stack.database, "call_id = ?", call_id)

    def saved_reports(self) -> list[bytes]:
        """Every squares.csv the capability saved."""
        return saved_reports(self.stack.media_root)


def job_row(database: Path, where: str, *args: str) -> dict[str, Any] | None:
    """The one `reports.squares` job row `where` finds."""
    with sqlite3.connect(database, timeout=20) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT call_id, status, cancel_source, stopped_at, hard_killed, progress,"
            f" progress_total FROM capabilities_job WHERE {where}"
            " AND capability = 'reports.squares'",
            args,
        ).fetchall()
    assert len(rows) <= 1, rows
    return dict(rows[0]) if rows else None


def saved_reports(media: Path) -> list[bytes]:
    return [path.read_bytes() for path in media.rglob("squares.csv")]


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
    that a `.pth` of the suite's site-packages starts) is never loaded there. The
    Python client's folder is one of them, as `pip install ./clients/python` would add
    it, for the tutorial's tests.
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
    (Path(site) / "suite-dependencies.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\n{ROOT / 'clients' / 'python'}\n"
    )
    wheel = build_wheel(folder)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         str(wheel)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return python


def write_project(python: Path, folder: Path, env: dict[str, str]) -> None:
    """startproject, then the documented blocks: settings appended, other files as shown.

    The settings keep the page's REDIS_URL: the stack's own settings module replaces it.
    """
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
                settings.write("\n" + code)
        else:
            assert how == ""
            (project / name).write_text(code)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("host-project")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(folder)),
        "PYTHONUNBUFFERED": "1",
    }
    python = host_environment(folder)
    write_project(python, folder, env)
    project = folder / "project"
    where = run(python, "-c", "import capabilities; print(capabilities.__file__)", cwd=project,
                env=env)  # fmt: skip
    assert Path(where.strip()).is_relative_to(folder / "venv"), where
    # Both queues, one child: jobs run one after the other (the module's docstring).
    stack = LiveStack(
        "mysite.settings",
        project_dir=project,
        python=python,
        env=env,
        run_dir=folder / "stack",
        concurrency=1,
    )
    try:
        with stack:
            yield Host(folder, python, env, stack)
    finally:
        for name in ("setup", "redis", "worker", "beat", "daphne"):
            tail = "\n".join(stack.log(name).splitlines()[-60:])
            print(f"--- {name}\n{tail}")


def manifest(host: Host) -> dict[str, Any]:
    url = f"{host.stack.http_url}/abp.json"
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
    result = host.stack.call("reports.squares", {"rows": 3, "title": "After"})
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
    with host.stack.client() as client:
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

        url = f"{host.stack.http_url}/mcp"
        async with official_client(url, key=host.stack.key, mode="legacy") as client:
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
    assert host.stack.database is not None
    with sqlite3.connect(host.stack.database, timeout=20) as db:
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


def test_the_tutorial_s_stack_tests_pass_in_the_project_with_the_pytest_plugin(
    host: Host,
) -> None:
    """The page's conftest.py and test file, run by pytest in the project: a stack of
    their own (`abp_stack`), where the cancelled call stopped at a checkpoint."""
    basetemp = host.folder / "tutorial-tests"
    done = subprocess.run(
        [str(host.python), "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider",
         f"--basetemp={basetemp}", LIVE_TESTS],
        cwd=host.project,
        env={**host.env, "DJANGO_SETTINGS_MODULE": "mysite.settings"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "2 passed" in done.stdout, done.stdout
    # Its stack is stopped by now: its database and files say what the work did.
    stack = basetemp / "abp-stack0"
    job = job_row(stack / "db.sqlite3", "status = 'cancelled'")
    assert job is not None
    assert job["cancel_source"] == "agent"
    assert job["stopped_at"] is not None
    assert not job["hard_killed"]
    assert job["progress"] < job["progress_total"] == 5000
    reports = saved_reports(stack / "media")
    assert [data.count(b"\n") for data in reports] == [301]  # the finished call's alone
