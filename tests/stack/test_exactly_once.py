"""200 calls, cancels at random moments: every call answered exactly once, consistently."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from typing import Any

from websockets.exceptions import ConnectionClosed

from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.stack import Stack

CALLS = 200
LONG_STEPS = 12_000  # of 5 ms: a minute


def run_random_calls(
    stack: Stack, rng: random.Random
) -> tuple[list[dict[str, Any]], list[str], list[str], uuid.UUID]:
    """Send CALLS calls and cancel about half at random moments; collect every reply."""
    received: list[dict[str, Any]] = []
    with Agent(stack.ws_url) as agent:
        agent.initialize()

        def receive_all() -> None:
            try:
                while True:
                    received.append(json.loads(agent.ws.recv()))
            except (ConnectionClosed, TimeoutError):
                return

        threading.Thread(target=receive_all, daemon=True).start()
        cancel_at: list[tuple[float, str]] = []
        sent_cancels: list[str] = []
        call_ids = [f"r{n}" for n in range(CALLS)]
        for call_id in call_ids:
            cancelled = rng.random() < 0.5
            # Whether a short call's cancel arrives before its end depends on the machine's
            # speed (a loaded Daphne lags behind the worker). A few cancelled calls run for
            # a minute, with checkpoints: their cancels land however slow the machine is.
            long = cancelled and rng.random() < 0.1
            steps = LONG_STEPS if long else rng.randint(0, 6)
            agent.call("test.sleep", {"steps": steps, "stepMs": 5}, call_id=call_id)
            if cancelled:
                cancel_at.append((time.monotonic() + rng.uniform(0, 0.3), call_id))
            time.sleep(rng.uniform(0, 0.004))
            sent_cancels += _send_due_cancels(agent, cancel_at)
        while cancel_at:
            sent_cancels += _send_due_cancels(agent, cancel_at)
            time.sleep(0.002)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _count(received, "capabilities/call-result") < CALLS:
            time.sleep(0.05)
        time.sleep(0.5)  # anything sent twice would have arrived by now
        return received, call_ids, sent_cancels, agent.session_id


def test_random_cancels_each_call_answered_once(stack: Stack) -> None:
    received, call_ids, sent_cancels, session_id = run_random_calls(stack, random.Random(20261129))
    results: dict[str, list[dict[str, Any]]] = {cid: [] for cid in call_ids}
    cancels: dict[str, list[dict[str, Any]]] = {}
    order: dict[str, list[str]] = {cid: [] for cid in call_ids}
    for envelope in received:
        payload = envelope["payload"]
        if envelope["type"] == "capabilities/call-result":
            results[payload["callId"]].append(payload)
            order[payload["callId"]].append("result")
        elif envelope["type"] == "capabilities/cancel-result":
            cancels.setdefault(payload["callId"], []).append(payload)
            order[payload["callId"]].append("cancel")

    assert all(len(r) == 1 for r in results.values()), {
        k: len(v) for k, v in results.items() if len(v) != 1
    }
    # Every cancel answered exactly once.
    assert sorted(sent_cancels) == sorted(c["callId"] for v in cancels.values() for c in v)
    jobs = {job.call_id: job for job in Job.objects.filter(session_id=session_id)}
    for call_id, (result,) in results.items():
        job = jobs[call_id]
        assert not job.is_active
        if result.get("cancelled"):
            assert job.status == JobStatus.CANCELLED
            # Only the agent cancelled here, so a cancelled call had a cancel that said so,
            # answered before the call-result.
            assert [c["cancelled"] for c in cancels[call_id]] == [True]
            assert order[call_id] == ["cancel", "result"]
        else:
            assert result["success"] is True
            assert job.status == JobStatus.SUCCEEDED
            for cancel in cancels.get(call_id, []):
                assert cancel == {
                    "callId": call_id,
                    "cancelled": False,
                    "reason": "Operation already completed",
                }
    assert len(sent_cancels) > 50  # the mix really exercised cancels
    assert any(r[0].get("cancelled") for r in results.values())
    assert any(not r[0].get("cancelled") for r in results.values())


def _send_due_cancels(agent: Agent, cancel_at: list[tuple[float, str]]) -> list[str]:
    now = time.monotonic()
    due = [item for item in cancel_at if item[0] <= now]
    for item in due:
        cancel_at.remove(item)
        agent.cancel(item[1])
    return [call_id for _, call_id in due]


def _count(received: list[dict[str, Any]], message_type: str) -> int:
    return sum(1 for e in received if e["type"] == message_type)
