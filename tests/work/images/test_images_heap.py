"""The image runner's malloc tuning (capabilities/work/images/heap.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from capabilities.work.images import heap
from tests.support.paths import ROOT

# Each test measures a process of its own.
pytestmark = pytest.mark.stack

# A job's pattern: the input's bytes, then a larger picture, both freed.
_JOBS = """
import resource, sys
from capabilities.work.images import heap
if sys.argv[1] == "kept":
    assert heap.keep_freed_memory()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    data = bytes(6_000_000)
    picture = bytearray(12_000_000)
    picture[::4096] = data[: len(picture[::4096])]
    del data, picture
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults[2:]))
"""


def _faults_per_job(mode: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", _JOBS, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(run.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_job_s_memory_is_kept_for_the_next() -> None:
    assert _faults_per_job("kept") < 100
    # Without it, glibc gives at least one of the blocks back between jobs.
    assert _faults_per_job("default") > 1000


def test_elsewhere_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert heap.keep_freed_memory() is False
