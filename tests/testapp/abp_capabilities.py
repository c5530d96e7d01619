"""Test-only capabilities: `test.sleep`, whose timing the tests control, and
`test.allocate`, a memory bomb. Declared with `@capability` and explicit schemas.

`test.sleep` modes:
- `checkpoint`: `steps` sleeps of `stepMs`, a checkpoint and a progress report each;
- `busy`: pure-Python busy work for `steps * stepMs` without any checkpoint (stopped
  only by raising into the thread);
- `block`: one long C-level sleep that nothing but a kill can stop;
- `fail`: raises CapabilityError(INVALID_PARAMS) after the steps;
- `crash`: raises a plain exception after the steps.

With `fileBytes`, the result also carries a file of that many random bytes.

`test.asyncTicks` is an `async def` ticking on `asyncio.sleep`, and `test.child` runs a
program of its own through `ctx.run_process`: both are declared from type hints.

`test.whoami` answers the username of `ctx.user`; `test.guarded` does too, for a user
with the permission `auth.view_user` alone; `test.scoped` too, for an OAuth token with
the scope `test:scoped` (keys are not asked).

`test.allocate` asks for `mb` MiB: `python` in zero-filled chunks held until the end
(every page touched), `glib` in one `g_malloc`, which aborts the process when it
fails, as the C libraries under WeasyPrint do.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from capabilities import CapabilityError, JobContext, capability

SLEEP_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "mode": {"enum": ["checkpoint", "busy", "block", "fail", "crash"]},
        "steps": {"type": "integer", "minimum": 0, "maximum": 100000},
        "stepMs": {"type": "integer", "minimum": 0, "maximum": 60000},
        "echo": {},
        "fileBytes": {"type": "integer", "minimum": 0, "maximum": 50_000_000},
    },
    "additionalProperties": False,
}


@capability(
    "test.sleep",
    description="Test only: sleeps, spins or blocks for a while.",
    input_schema=SLEEP_INPUT,
    output_schema={"type": "object"},
)
def run_sleep(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sleep, spin or block as told, then return what was asked."""
    mode = params.get("mode", "checkpoint")
    steps = int(params.get("steps", 10))
    step_seconds = int(params.get("stepMs", 20)) / 1000
    if mode == "busy":
        end = time.monotonic() + steps * step_seconds
        spins = 0
        while time.monotonic() < end:
            spins += 1
        return {"spins": spins, "echo": params.get("echo")}
    if mode == "block":
        time.sleep(steps * step_seconds)
        return {"echo": params.get("echo")}
    for step in range(steps):
        ctx.checkpoint()
        time.sleep(step_seconds)
        ctx.report(progress=step + 1, total=steps, stage="sleeping")
    if mode == "fail":
        raise CapabilityError("INVALID_PARAMS", "Asked to fail.", details={"path": "params.mode"})
    if mode == "crash":
        raise RuntimeError("asked to crash")
    data: dict[str, Any] = {"echo": params.get("echo"), "steps": steps}
    if "fileBytes" in params:
        data["file"] = ctx.save_file(
            os.urandom(params["fileBytes"]),
            mime_type="application/octet-stream",
            filename="blob.bin",
        )
    return data


MIB = 1024 * 1024
ALLOCATION_CHUNK = 16 * MIB


@capability(
    "test.allocate",
    description="Test only: allocates a given amount of memory.",
    input_schema={
        "type": "object",
        "properties": {
            "mb": {"type": "integer", "minimum": 0, "maximum": 3072},
            "via": {"enum": ["python", "glib"]},
        },
        "required": ["mb"],
        "additionalProperties": False,
    },
    output_schema={"type": "object"},
)
def run_allocate(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Allocate `mb` MiB as told, then let it go."""
    size = int(params["mb"]) * MIB
    if params.get("via", "python") == "glib":
        # No core file from the abort that follows a failed g_malloc.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        glib = ctypes.CDLL("libglib-2.0.so.0")
        glib.g_malloc.restype = ctypes.c_void_p
        glib.g_malloc.argtypes = [ctypes.c_size_t]
        glib.g_free.argtypes = [ctypes.c_void_p]
        glib.g_free(glib.g_malloc(size))
        return {"allocatedMb": params["mb"]}
    chunks: list[bytearray] = []
    while len(chunks) * ALLOCATION_CHUNK < size:
        ctx.checkpoint()
        chunks.append(bytearray(ALLOCATION_CHUNK))
    return {"allocatedMb": params["mb"]}


@dataclass
class Ticks:
    """How long `test.asyncTicks` runs: `ticks` awaits of `tick_ms`."""

    ticks: int = 1000
    tick_ms: int = 10


@dataclass
class Ticked:
    ticks: int


@capability("test.asyncTicks", description="Test only: an async def awaiting asyncio.sleep.")
async def run_async_ticks(params: Ticks, ctx: JobContext) -> Ticked:
    """Await `ticks` sleeps, reporting each: a cancel cancels the task at its await."""
    for tick in range(params.ticks):
        await asyncio.sleep(params.tick_ms / 1000)
        ctx.report(progress=tick + 1, total=params.ticks, stage="ticking")
    return Ticked(ticks=params.ticks)


@dataclass
class Child:
    """`test.child` runs `sleep seconds` in a child whose pid it writes to `pid_file`."""

    pid_file: str
    seconds: int = 60


@dataclass
class ChildDone:
    code: int


@capability("test.child", description="Test only: a child process through ctx.run_process.")
def run_child(params: Child, ctx: JobContext) -> ChildDone:
    """A program of its own, which a cancel must kill with its process group."""
    script = f'echo $$ > "$1"; exec sleep {params.seconds}'
    done = ctx.run_process(["sh", "-c", script, "child", params.pid_file])
    return ChildDone(code=done.returncode)


@dataclass
class Nothing:
    pass


@dataclass
class Whoami:
    user: str | None


@capability(
    "test.whoami", description="Test only: the username of ctx.user, or null.", cost="small"
)
def run_whoami(params: Nothing, ctx: JobContext) -> Whoami:
    return Whoami(user=ctx.user.get_username() if ctx.user is not None else None)


@capability(
    "test.guarded",
    description="Test only: ctx.user's username, for a user who may view users.",
    permissions=["auth.view_user"],
)
def run_guarded(params: Nothing, ctx: JobContext) -> Whoami:
    return Whoami(user=ctx.user.get_username() if ctx.user is not None else None)


@capability(
    "test.scoped",
    description="Test only: ctx.user's username, for a token with the scope test:scoped.",
    cost="small",
    scopes=["test:scoped"],
)
def run_scoped(params: Nothing, ctx: JobContext) -> Whoami:
    return Whoami(user=ctx.user.get_username() if ctx.user is not None else None)
