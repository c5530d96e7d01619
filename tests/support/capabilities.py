"""`test.sleep`: a capability whose timing the tests control.

Modes:
- `checkpoint`: `steps` sleeps of `stepMs`, a checkpoint and a progress report each;
- `busy`: pure-Python busy work for `steps * stepMs` without any checkpoint (stopped
  only by raising into the thread);
- `block`: one long C-level sleep that nothing but a kill can stop;
- `fail`: raises CapabilityError(INVALID_PARAMS) after the steps;
- `crash`: raises a plain exception after the steps.

With `fileBytes`, the result also carries a file of that many random bytes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from capabilities.context import CapabilityError, JobContext
from capabilities.registry import CapabilitySpec


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


SLEEP = CapabilitySpec(
    name="test.sleep",
    description="Test only: sleeps, spins or blocks for a while.",
    input_schema={
        "type": "object",
        "properties": {
            "mode": {"enum": ["checkpoint", "busy", "block", "fail", "crash"]},
            "steps": {"type": "integer", "minimum": 0, "maximum": 100000},
            "stepMs": {"type": "integer", "minimum": 0, "maximum": 60000},
            "echo": {},
            "fileBytes": {"type": "integer", "minimum": 0, "maximum": 50_000_000},
        },
        "additionalProperties": False,
    },
    output_schema={"type": "object"},
    runner="tests.support.capabilities.run_sleep",
)
