"""How long agent B's one job waits while agent A has 200 queued, and the answer with no worker.

Through the whole stack (Daphne, Redis, a heavy worker with two processes, a small
worker, beat):

1. Agent A queues 200 `test.sleep` jobs of about 200 ms each on the heavy queue;
   once two of them run, agent B sends one job of the same size. B's wait (from its
   call to its job's start) is printed beside A's jobs' service time: with fair
   shares B starts when the first running job ends; in one first-in-first-out queue
   it would wait behind all 200 (about 20 s here).
2. The heavy worker killed by PID: how long until a connected session is told its
   capabilities are unavailable, and, once started again, available.
3. A call to a capability whose queue no live worker consumes (a Daphne with that
   capability moved to an empty queue), alternated with a small call that runs,
   both on the same client: the refusal's round trip against a normal answer.

Run: .venv/bin/python bench/fair_share.py [--rounds 5] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

from bench import stats  # noqa: E402
from capabilities.access import agent_keys  # noqa: E402
from capabilities.models import Job, JobStatus  # noqa: E402
from tests.support.agent import Agent, Envelope  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

JOB = {"mode": "checkpoint", "steps": 10, "stepMs": 20}
TINY = {"mode": "checkpoint", "steps": 0, "stepMs": 0}
MARKDOWN = {"markdown": "# Title"}


def one_round(number: int, batch: int) -> tuple[float, float, int]:
    """B's wait (ms), A's median job time (ms), and how many of A's jobs started before B's."""
    a_key = agent_keys.create_key(f"bench A {number}")[1]
    b_key = agent_keys.create_key(f"bench B {number}")[1]
    with Agent(STACK.ws_url, key=a_key) as a, Agent(STACK.ws_url, key=b_key) as b:
        a.initialize()
        b.initialize()
        calls = [a.call("test.sleep", JOB, call_id=f"a{n}") for n in range(batch)]
        running = Job.objects.filter(session_id=a.session_id, status=JobStatus.RUNNING)
        eventually(lambda: running.count() >= 2 or None, timeout=30)
        sent = time.time()
        b.result_of(b.call("test.sleep", JOB, call_id="b"), timeout=120)
        for call in calls:
            a.result_of(call, timeout=300)
        theirs = Job.objects.get(session_id=b.session_id, call_id="b")
        assert theirs.started_at is not None
        ahead = Job.objects.filter(
            session_id=a.session_id, started_at__lt=theirs.started_at
        ).count()
        a_times = [
            (job.stopped_at - job.started_at).total_seconds() * 1000
            for job in Job.objects.filter(session_id=a.session_id)
            if job.started_at and job.stopped_at
        ]
    return (theirs.started_at.timestamp() - sent) * 1000, stats.summary(a_times)["p50"], ahead


def availability_flips(rounds: int) -> list[tuple[float, float]]:
    """Seconds from killing the heavy worker (by PID) to the notification, and from
    starting it again to the one that says it is back."""
    flips: list[tuple[float, float]] = []
    with Agent(STACK.ws_url) as agent:
        agent.initialize(notifications=True)
        for _ in range(rounds):
            killed = time.monotonic()
            STACK.worker.kill()
            agent.wait_for(_changed(available=False), timeout=30)
            gone = time.monotonic() - killed
            started = time.monotonic()
            STACK.start_worker()
            agent.wait_for(_changed(available=True), timeout=30)
            flips.append((gone, time.monotonic() - started))
    return flips


def _changed(*, available: bool) -> Callable[[Envelope], bool]:
    def matches(envelope: Envelope) -> bool:
        payload = envelope["payload"]
        if payload.get("event") != "notifications/capabilities/changed":
            return False
        states = {c["name"]: c["available"] for c in payload["data"]["capabilities"]}
        return states.get("export.pdf") is available

    return matches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    waits: list[float] = []
    services: list[float] = []
    aheads: list[int] = []
    refused: list[float] = []
    answered: list[float] = []
    try:
        STACK.start()
        for number in range(args.rounds):
            wait, service, ahead = one_round(number, args.calls)
            waits.append(wait)
            services.append(service)
            aheads.append(ahead)
        with (
            STACK.another_web(
                "daphne-no-worker", {"ABP_CAPABILITY_QUEUES": "test.sleep=abp.none"}
            ) as where,
            Agent(f"ws://{where}/abp/ws") as agent,
        ):
            agent.initialize()
            for _ in range(10):
                agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN))
            for _ in range(100):
                start = time.perf_counter()
                error = agent.result_of(agent.call("test.sleep", TINY))["payload"]["error"]
                refused.append((time.perf_counter() - start) * 1000)
                assert error["code"] == "CAPABILITY_UNAVAILABLE"
                start = time.perf_counter()
                result = agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN))
                answered.append((time.perf_counter() - start) * 1000)
                assert result["payload"]["success"] is True
                agent.inbox.clear()
        flips = availability_flips(rounds=3)
    finally:
        STACK.stop()
        STACK.remove_files()
    print(f"\n== Agent B's one job while agent A has {args.calls} queued (heavy worker, 2 slots)")
    print(stats.line("A's jobs, run time each", services))
    print(stats.line("B's wait, call to start", waits, stats.summary(services)["p50"]))
    print(f"  A's jobs started before B's: {aheads} (of {args.calls}; 2 were running)")
    ttl = os.environ["ABP_WORKER_TTL_SECONDS"]
    print(f"\n== The heavy worker killed by PID, then started again (TTL {ttl} s)")
    for gone, back in flips:
        print(f"  kill -> unavailable notified: {gone:5.2f} s   start -> available: {back:5.2f} s")
    print("\n== A call no live worker can run, against one that runs (same client, alternated)")
    print(stats.line("markdownToHtml, answered", answered))
    print(stats.line("test.sleep, CAPABILITY_UNAVAILABLE", refused, stats.summary(answered)["p50"]))


if __name__ == "__main__":
    main()
