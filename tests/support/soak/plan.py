"""What each call is: small or heavy, its parameters, when it is cancelled, its timeout.

A call's tag goes in its parameters (a markdown heading, or test.sleep's `echo`), so
that its result, and its job row, name it whatever door it came through.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

SMALL = "convert.markdownToHtml"
# A heavy call's timeout: its run plus this (time in the queue counts: docs/protocol.md).
HEAVY_SLACK_SECONDS = 30.0
HEAVY = "test.sleep"

# When a cancel goes, relative to the call (seconds), by the moment it aims at.
# "race" aims at the heavy call's own end, so cancel and result cross.
CANCEL_PLANS: dict[str, tuple[float, float]] = {
    "before-row": (0.0, 0.0),  # right behind the call, racing its row
    "queued": (0.01, 0.15),  # while it waits for its row, its slot or its worker
    "dispatched": (0.15, 0.6),  # handed to Celery, maybe not started
    "running": (0.6, 2.0),
}


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One call to make."""

    capability: str
    seconds: float  # how long it runs (heavy) or 0
    cancel_plan: str | None
    cancel_after: float | None
    timeout_ms: int | None  # the server's limit, asked for (heavy only)


@dataclass(frozen=True, kw_only=True)
class Mix:
    """Shares of the load."""

    # About two-thirds of the heavy workers' slots (docs/reliability.md#the-load): a
    # call that waits past its deadline then points at the service, not at a full queue.
    heavy: float = 0.11
    cancel_small: float = 0.08
    cancel_heavy: float = 0.45
    timeout_heavy: float = 0.12  # a server timeout shorter than the run


def next_call(rng: random.Random, mix: Mix, *, cancels: bool = True) -> Planned:
    """Draw the next call."""
    if rng.random() >= mix.heavy:
        if cancels and rng.random() < mix.cancel_small:
            plan = rng.choice(["before-row", "queued", "race"])
            after = 0.0 if plan == "before-row" else rng.uniform(0.0, 0.05)
            return Planned(
                capability=SMALL, seconds=0.0, cancel_plan=plan, cancel_after=after, timeout_ms=None
            )
        return Planned(
            capability=SMALL, seconds=0.0, cancel_plan=None, cancel_after=None, timeout_ms=None
        )
    seconds = round(rng.uniform(0.5, 3.0), 2)
    # Every heavy call has a deadline well within the run, so that one left queued or
    # running shows as past it; some have one shorter than their run (a server timeout).
    timeout_ms = int((seconds + HEAVY_SLACK_SECONDS) * 1000)
    if rng.random() < mix.timeout_heavy:
        timeout_ms = int(rng.uniform(0.2, 0.8) * seconds * 1000)
    if not cancels or rng.random() >= mix.cancel_heavy:
        return Planned(
            capability=HEAVY, seconds=seconds, cancel_plan=None, cancel_after=None,
            timeout_ms=timeout_ms,
        )  # fmt: skip
    plan = rng.choice([*CANCEL_PLANS, "race"])
    if plan == "race":
        after = seconds + rng.uniform(-0.05, 0.15)
    else:
        low, high = CANCEL_PLANS[plan]
        after = rng.uniform(low, min(high, seconds))
    return Planned(
        capability=HEAVY, seconds=seconds, cancel_plan=plan, cancel_after=round(after, 3),
        timeout_ms=timeout_ms,
    )  # fmt: skip


def params_for(tag: str, planned: Planned) -> dict[str, Any]:
    """The call's parameters, naming it."""
    if planned.capability == SMALL:
        return {"markdown": f"# Call {tag}\n\nSome *emphasis* and a [link](https://example.com)."}
    steps = max(1, round(planned.seconds * 20))
    return {"mode": "checkpoint", "steps": steps, "stepMs": 50, "echo": tag}


# The tag of a job row, from its params (the inverse of params_for), in SQL.
ROW_TAG_SQL = (
    "COALESCE(params->>'echo', split_part(split_part(params->>'markdown', E'\\n', 1), ' ', 3))"
)
