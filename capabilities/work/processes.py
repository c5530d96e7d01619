"""`ctx.run_process`: a program of a capability's own, stopped with its job.

The program runs in a session (and process group) of its own, so a cancel reaches
everything it started: SIGTERM to the group at once, SIGKILL after
TERMINATE_GRACE_SECONDS. The work then gets `JobAborted`, never the program's output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from capabilities.work.cancel_signal import CancelSignal
from capabilities.work.context import JobAborted

# Kept well under the worker's HARD_KILL_GRACE_SECONDS: a worker process killed
# first would leave the group running on its own.
TERMINATE_GRACE_SECONDS = 1.0


def run_process(
    args: str | Sequence[str],
    cancel: CancelSignal,
    *,
    input: bytes | str | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(args, ...)` whose process group is killed on a cancel."""
    if cancel.is_set:
        raise JobAborted()
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    if capture_output:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    popen["start_new_session"] = True
    popen.pop("process_group", None)
    with subprocess.Popen(args, **popen) as process:
        forget = cancel.add(lambda: _terminate(process))
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            # A timeout, or JobAborted raised into this thread: nothing of it may outlive the call.
            _signal_group(process, signal.SIGKILL)
            process.wait()
            raise
        finally:
            forget()
    if cancel.is_set:
        raise JobAborted()
    returncode = process.returncode
    if check and returncode:
        raise subprocess.CalledProcessError(returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, returncode, stdout, stderr)


def _terminate(process: subprocess.Popen[Any]) -> None:
    """SIGTERM to the group now, SIGKILL after the grace (from the cancelling thread)."""
    _signal_group(process, signal.SIGTERM)
    killer = threading.Timer(TERMINATE_GRACE_SECONDS, _signal_group, (process, signal.SIGKILL))
    killer.daemon = True
    killer.start()


def _signal_group(process: subprocess.Popen[Any], number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(process.pid, number)
