"""Cancel latencies and small-call overhead through the whole stack.

Prints, over real WebSockets against Daphne, Redis and a prefork Celery worker:
- the WebSocket round trip (ping/pong, and a frame answered by the consumer);
- cancel -> cancel-result, cancel -> call-result, cancel -> work stopped
  (Job.stopped_at), for a running test.sleep and for a running export.pdf
  (cancels land in every stage, mid-layout included);
- a small call's round trip against a bare Celery apply_async/get round trip.

Run: .venv/bin/python bench/cancel_latency.py [--cancels 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-")

from bench import stats  # noqa: E402
from bench.common import bare_celery_calls, bare_worker  # noqa: E402
from capabilities.models import Job, JobStatus  # noqa: E402
from tests.support.agent import Agent  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

PDF_HTML = "".join(
    f"<section style='page-break-after: always'><h1>Page {n}</h1>{'<p>text</p>' * 20}</section>"
    for n in range(60)
)


def ws_round_trips(agent: Agent, n: int) -> tuple[list[float], list[float]]:
    """Ping/pong (transport only) and a frame the consumer answers without DB work."""
    pings, frames = [], []
    for _ in range(n):
        start = time.perf_counter()
        agent.ws.ping().wait(5)
        pings.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        message_id = agent.send("initialize", {})  # answered ALREADY_INITIALIZED
        agent.reply_to(message_id, "initialize-result")
        frames.append((time.perf_counter() - start) * 1000)
    return pings, frames


def small_calls(agent: Agent, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        agent.result_of(agent.call("test.sleep", {"steps": 0}))
        times.append((time.perf_counter() - start) * 1000)
    return times


@dataclass
class CancelRun:
    """What one series of cancels measured."""

    to_confirm: list[float] = field(default_factory=list)
    to_result: list[float] = field(default_factory=list)
    to_stop: list[float] = field(default_factory=list)
    # A consumer-frame round trip taken right before each cancel, under the same load.
    rtt_under_load: list[float] = field(default_factory=list)
    mid_layout: int = 0


def cancels(
    agent: Agent, n: int, capability: str, params: dict[str, object], rng: random.Random
) -> CancelRun:
    """Cancel n running calls at random moments of their work."""
    run = CancelRun()
    by_stage: list[tuple[float, str]] = []
    for i in range(n):
        call_id = f"{capability}-{i}"
        call = agent.call(capability, params, call_id=call_id, progress_token=call_id)
        jobs = Job.objects.filter(session_id=agent.session_id, call_id=call_id)
        eventually(jobs.filter(status=JobStatus.RUNNING).exists, interval=0.002)
        # Let the work get somewhere: from its first instructions to deep in layout.
        time.sleep(rng.uniform(0, 0.25))
        start = time.perf_counter()
        agent.reply_to(agent.send("initialize", {}), "initialize-result")
        run.rtt_under_load.append((time.perf_counter() - start) * 1000)
        wall = time.time()
        start = time.perf_counter()
        cancel = agent.cancel(call_id)
        agent.reply_to(cancel, "capabilities/cancel-result")
        run.to_confirm.append((time.perf_counter() - start) * 1000)
        result = agent.result_of(call)
        run.to_result.append((time.perf_counter() - start) * 1000)
        if not result["payload"].get("cancelled"):
            continue  # finished before the cancel: no stop to measure
        stage = _stage_when_cancelled(agent, cancel)
        if stage == "layout":
            run.mid_layout += 1
        job = eventually(jobs.filter(stopped_at__isnull=False).first, timeout=15)
        assert job.stopped_at is not None
        run.to_stop.append((job.stopped_at.timestamp() - wall) * 1000)
        by_stage.append((run.to_stop[-1], stage or "start"))
        agent.inbox.clear()
    slowest = ", ".join(f"{ms:.0f} ms ({stage})" for ms, stage in sorted(by_stage)[-5:])
    print(f"  {capability}: slowest stops: {slowest}", flush=True)
    return run


def _stage_when_cancelled(agent: Agent, cancel_id: str) -> str:
    """The stage of the last progress the agent got before the cancel-result."""
    stage = ""
    for envelope in agent.inbox:
        if envelope["type"] == "capabilities/cancel-result" and envelope["id"] == cancel_id:
            break
        if envelope["type"] == "progress":
            stage = envelope["payload"]["stage"]
    return stage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--round-trips", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(1)
    bare = bare_worker(STACK.run_dir)
    try:
        STACK.start()
        bare.start(lambda: " ready." in bare.log_text())
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            small_calls(agent, 20)  # warm up workers and connections
            bare_celery_calls(20)
            pings, frames = ws_round_trips(agent, args.round_trips)
            stack_calls = small_calls(agent, args.round_trips)
            celery_calls = bare_celery_calls(args.round_trips)
            sleep_runs = cancels(
                agent, args.cancels, "test.sleep", {"steps": 1000, "stepMs": 5}, rng
            )
            pdf_runs = cancels(agent, args.cancels, "export.pdf", {"html": PDF_HTML}, rng)
    finally:
        bare.stop()
        STACK.stop()
        STACK.remove_files()

    ping_p50 = stats.summary(pings)["p50"]
    frame_p50 = stats.summary(frames)["p50"]
    print("\n== WebSocket round trip (baselines)")
    print(stats.line("ping/pong (transport only)", pings))
    print(stats.line("frame answered by the consumer (no DB)", frames))
    for label, run in (
        ("test.sleep (checkpoints every 5 ms)", sleep_runs),
        ("export.pdf (60 pages)", pdf_runs),
    ):
        loaded_p50 = stats.summary(run.rtt_under_load)["p50"]
        print(f"\n== cancel of a running {label}")
        print(stats.line("frame RTT under the same load (baseline)", run.rtt_under_load))
        print(stats.line("cancel -> cancel-result (vs RTT under load)", run.to_confirm, loaded_p50))
        print(stats.line("cancel -> cancel-result (vs idle frame RTT)", run.to_confirm, frame_p50))
        print(stats.line("cancel -> cancel-result (vs idle ping RTT)", run.to_confirm, ping_p50))
        print(stats.line("cancel -> call-result", run.to_result))
        print(stats.line("cancel -> work stopped (Job.stopped_at)", run.to_stop))
        print(f"   cancels that landed mid-layout: {run.mid_layout} of {len(run.to_stop)} stopped")
    celery_p50 = stats.summary(celery_calls)["p50"]
    print("\n== small call round trip")
    print(stats.line("bare Celery apply_async().get()", celery_calls))
    print(stats.line("test.sleep {steps: 0} through the whole stack", stack_calls, celery_p50))


if __name__ == "__main__":
    main()
