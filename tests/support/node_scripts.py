"""Node scripts that drive a door with an official TypeScript SDK (tests/*_typescript/).

Each script prints one JSON report and holds its session until its standard input
closes, so a test reads the jobs while the session is still open.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def node_for(package: Path, installed: str) -> str:
    """The node binary, with `package`'s `installed` module in place.

    A missing node or missing packages fail the tests: they are part of the suite.
    """
    found = shutil.which("node")
    if found is None:
        pytest.fail("node is not on PATH (Debian's nodejs package provides it)")
    if not (package / "node_modules" / installed).is_dir():
        pytest.fail(f"no node packages in {package}: `make test` runs `npm ci` there")
    return found


@contextmanager
def report_of(
    node: str, package: Path, script: str, args: tuple[str, ...], env: dict[str, str]
) -> Iterator[dict[str, Any]]:
    """Run a script; its report, while it holds its session (ended on the way out)."""
    with subprocess.Popen(
        [node, script, *args],
        cwd=package,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ABP_AGENT_KEY": os.environ["ABP_TEST_AGENT_KEY"], **env},
    ) as process:
        assert process.stdout is not None
        try:
            # The script's watchdog ends it within a minute: this read cannot hang.
            line = process.stdout.readline()
            if not line:
                _, stderr = process.communicate(timeout=10)
                pytest.fail(f"{script} reported nothing (exit {process.returncode}):\n{stderr}")
            yield json.loads(line)
            # Its standard input closed, the script ends its session and exits.
            _, stderr = process.communicate(timeout=30)
            assert process.returncode == 0, f"{script} exited {process.returncode}:\n{stderr}"
        finally:
            if process.poll() is None:
                process.kill()
