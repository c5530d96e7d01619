"""The version matrix: every supported Python and Django, beside `make test`'s own.

`make test` runs the whole suite on the primary combination (the newest: Python 3.13,
Django 6.1) from the lock. Each session here makes a fresh environment with uv from
the package's ranges instead, as a host's resolver would, and runs the in-process
tests and the host project's stack tests (tests/testing/test_host_project.py). The
oldest cell resolves every direct dependency to the lowest version in its range (uv's
lowest-direct: Django 5.2.0, Celery 5.5.0, Channels 4.2.0, ...), so the lower bounds
in pyproject.toml say what was tested. `make test-matrix` runs them all;
`nox -s "matrix(python='3.11', django='5.2')"` runs one. docs/installing.md#versions.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).parent
EXTRAS = "pdf,images,markdown,s3,postgres,tracing,oauth"

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
nox.options.reuse_existing_virtualenvs = False

# (Python, Django series, every direct dependency at its lowest). The primary
# combination, 3.13 x 6.1, is `make test`'s.
CELLS = [
    ("3.11", "5.2", True),
    ("3.13", "5.2", False),
    ("3.12", "6.0", False),
]


def interpreter(version: str) -> str:
    """The interpreter scripts/find-python finds (pyenv's, where PATH has no working one)."""
    found = subprocess.run(
        [str(ROOT / "scripts" / "find-python"), version],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise SystemExit(found.stderr.strip())
    return found.stdout.strip()


@nox.session(name="matrix")
@nox.parametrize(("python", "django", "lowest"), CELLS, ids=[f"{p}-django{d}" for p, d, _ in CELLS])
def matrix(session: nox.Session, django: str, lowest: bool) -> None:
    """test-fast, then the host project's stack tests, on one Python x Django."""
    session.install(
        "-r", "requirements/dev.in",
        "-e", f".[{EXTRAS}]",
        "-e", "./clients/python[cli]",
        f"Django~={django}.0",
        *(["--resolution=lowest-direct"] if lowest else []),
    )  # fmt: skip
    session.run("python", "-c", "import django, celery, channels, sys; print("
                "'Python', sys.version.split()[0], '| Django', django.__version__,"
                " '| Celery', celery.__version__, '| Channels', channels.__version__)")  # fmt: skip
    env = {
        "ABP_TEST_DATABASE": "sqlite",
        "ABP_TEST_ARTIFACTS": f"{session.virtualenv.location}/artifacts",
    }
    pytest = ("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs)
    session.run(
        *pytest, "-m", "not stack and not postgres", "--ignore=tests/stack",
        "--ignore=tests/browser", env={**env, "ABP_TEST_LANE": "fast"},
    )  # fmt: skip
    session.run(*pytest, "tests/testing/test_host_project.py", env=env)


def _bind_interpreters() -> None:
    # nox looks interpreters up on PATH by name; pyenv's shims answer only for the
    # version pyenv selected, so each cell's is put first on PATH.
    folders = {str(Path(interpreter(python)).parent) for python, _, _ in CELLS}
    os.environ["PATH"] = os.pathsep.join([*sorted(folders), os.environ.get("PATH", "")])


# Never a Python downloaded by uv: the cells run on the machine's interpreters. Bytecode
# compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set, every process
# of a cell's stack would compile its imports again.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
_bind_interpreters()
