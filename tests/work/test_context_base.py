"""The cancel tools every JobContext shares: cancelled, wait, on_cancel, run_process; read_bytes.

Pure: the context is `capabilities.testing`'s, cancelled by the test's own thread.
Nothing waits for a duration: each check waits for an event (a file written, a
process gone) with a generous bound.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from capabilities.testing import RecordingContext
from capabilities.work.context import CapabilityError, JobAborted
from tests.support.waiting import eventually

TIMEOUT = 10.0


def test_cancelled_wait_and_on_cancel_follow_the_cancel() -> None:
    ctx = RecordingContext()
    heard: list[str] = []
    ctx.on_cancel(lambda: heard.append(threading.current_thread().name))
    assert not ctx.cancelled
    assert ctx.wait(0) is False
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(ctx.wait(60)))
    waiter.start()
    canceller = threading.Thread(target=ctx.cancel, name="canceller")
    canceller.start()
    canceller.join(TIMEOUT)
    waiter.join(TIMEOUT)
    assert waited == [True]  # woken by the cancel, long before its 60 s
    assert ctx.cancelled
    assert heard == ["canceller"]  # once, from the thread that cancelled
    ctx.cancel()
    assert heard == ["canceller"]
    with pytest.raises(JobAborted):
        ctx.checkpoint()


def test_on_cancel_after_the_cancel_runs_at_once() -> None:
    ctx = RecordingContext()
    ctx.cancel()
    heard: list[bool] = []
    ctx.on_cancel(lambda: heard.append(True))
    assert heard == [True]


def test_a_failing_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    ctx = RecordingContext()
    heard: list[int] = []
    ctx.on_cancel(lambda: 1 / 0)
    ctx.on_cancel(lambda: heard.append(2))
    ctx.cancel()
    assert heard == [2]
    assert "on_cancel callback failed" in caplog.text


def test_cancel_at_checkpoint_sets_cancelled() -> None:
    ctx = RecordingContext(cancel_at_checkpoint=2)
    ctx.checkpoint()
    assert not ctx.cancelled
    with pytest.raises(JobAborted):
        ctx.checkpoint()
    assert ctx.cancelled
    assert ctx.checkpoints == 2


@pytest.mark.stack  # runs a program
def test_run_process_runs_as_subprocess_run_does() -> None:
    ctx = RecordingContext()
    done = ctx.run_process(
        [sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"],
        input=b"hi",
        capture_output=True,
        check=True,
    )
    assert done.returncode == 0
    assert done.stdout.strip() == b"HI"
    with pytest.raises(subprocess.CalledProcessError):
        ctx.run_process([sys.executable, "-c", "raise SystemExit(3)"], check=True)


def gone(pid: int) -> bool:
    """Whether the process ended (a zombie nobody reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.stack  # runs a program
def test_a_cancel_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A shell that starts a grandchild ignoring SIGTERM (SIGKILL after the grace ends it),
    # writes both pids, and waits.
    script = 'trap \'\' TERM; sleep 600 & echo $$ $! > "$1.tmp"; mv "$1.tmp" "$1"; wait'
    ctx = RecordingContext()
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            ctx.run_process(["sh", "-c", script, "sh", str(pids)])
        except BaseException as raised:
            outcome.append(raised)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    written = eventually(lambda: pids.read_text() if pids.exists() else None, TIMEOUT)
    shell, sleeper = (int(pid) for pid in written.split())
    assert os.getpgid(sleeper) == shell  # its own group, led by the shell
    assert os.getpgid(shell) != os.getpgid(0)
    ctx.cancel()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], JobAborted)
    eventually(lambda: gone(shell) and gone(sleeper), TIMEOUT)


def test_run_process_after_a_cancel_starts_nothing(tmp_path: Path) -> None:
    ctx = RecordingContext()
    ctx.cancel()
    marker = tmp_path / "ran"
    with pytest.raises(JobAborted):
        ctx.run_process(["touch", str(marker)])
    assert not marker.exists()


def test_read_bytes_takes_base64_uploads_and_refusals() -> None:
    ctx = RecordingContext()
    encoded = base64.b64encode(b"\x00\x01binary").decode()
    assert ctx.read_bytes({"content": encoded, "encoding": "base64"}) == b"\x00\x01binary"
    assert ctx.read_bytes(encoded[:8] + "\r\n" + encoded[8:]) == b"\x00\x01binary"
    assert ctx.read_bytes({"content": b"uploaded"}) == b"uploaded"
    refused = CapabilityError("INVALID_PARAMS", "Not yours.", details={"path": "params.f.uploadId"})
    with pytest.raises(CapabilityError) as raised:
        ctx.read_bytes({"content": refused})
    assert raised.value is refused
    with pytest.raises(CapabilityError) as invalid:
        ctx.read_bytes({"content": "not base64!"})
    assert invalid.value.code == "INVALID_PARAMS"
