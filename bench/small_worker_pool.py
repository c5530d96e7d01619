"""The small queue's worker under each Celery pool: memory, round trip, cancels.

Every candidate (prefork -c 1 as shipped, solo, threads -c 1, threads -c 4) runs at
once: a worker of its own on a queue of its own, and a Daphne of its own that routes
convert.markdownToHtml and the test capabilities there (ABP_CAPABILITY_QUEUES). The
stack's own small worker runs the reaper (abp.small) for all of them. Prints:
- the worker's process tree (main process and children), idle after warm-up and
  after the markdown calls: RSS, PSS and USS (private pages) summed over the tree
  from /proc/<pid>/smaps_rollup;
- convert.markdownToHtml round trips over /abp/ws, interleaved rounds, one client;
- cancels: a busy loop without checkpoints (only a raise into the task's thread
  stops it), a C-level sleep (only a kill stops it), the same sleep past its
  deadline (Celery's time limits, the reaper), a job longer than
  ABP_WORKER_LOST_AFTER_SECONDS (only the heartbeat keeps it alive); with more than
  one thread, two jobs at once; then a job past the memory ceiling.

Run: .venv/bin/python bench/small_worker_pool.py [--calls 200] [--cancels 5] [--keep-logs]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment
from tests.support.stack import ManagedProcess, free_port, port_open, python_tool

STACK = environment.prepare("abp-bench-")

from bench import stats  # noqa: E402
from capabilities.models import Job, JobStatus  # noqa: E402
from tests.support.agent import Agent  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

MARKDOWN = {
    "markdown": "# Title\n\nSome *text*, a [link](https://example.com) and `code`.\n\n"
    + "".join(f"- item {n} with **bold** text\n" for n in range(10))
    + "\n```\nprint('hello')\n```\n"
}
SECONDS_OF_WORK = 8
BUSY = {"mode": "busy", "steps": SECONDS_OF_WORK * 100, "stepMs": 10}
BLOCK = {"mode": "block", "steps": 1, "stepMs": SECONDS_OF_WORK * 1000}
# Longer than ABP_WORKER_LOST_AFTER_SECONDS (3 s in the bench's environment).
LONG_CHECKPOINTED = {"mode": "checkpoint", "steps": 25, "stepMs": 200}
# A raise lands within milliseconds; a job still running a second after its cancel
# was not stopped by one.
STOPPED_WITHIN_MS = 1000
# Past ABP_WORKER_MEMORY_LIMIT_MB (1024 in the bench's environment).
ALLOCATION_MB = 1536
# The call timeout of a job that outlives it.
DEADLINE_MS = 2000
KIB = 1024


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One way to run the small worker."""

    pool: str
    concurrency: int

    @property
    def label(self) -> str:
        """How the table names it."""
        return self.pool if self.pool == "solo" else f"{self.pool} -c {self.concurrency}"

    @property
    def queue(self) -> str:
        """Its own queue, so that every candidate runs at once."""
        return f"abp.small.{self.pool}{self.concurrency}"


CANDIDATES = (
    Candidate(pool="prefork", concurrency=1),
    Candidate(pool="solo", concurrency=1),
    Candidate(pool="threads", concurrency=1),
    Candidate(pool="threads", concurrency=4),
)


@dataclass(frozen=True, kw_only=True)
class Memory:
    """A process tree's memory, in KiB."""

    processes: int
    rss: int
    pss: int
    uss: int


@dataclass(frozen=True, kw_only=True)
class Stop:
    """How a job told to stop (by a cancel, or its deadline) ended."""

    stopped_ms: float | None  # cancel/deadline -> Job.stopped_at; None: not within the wait
    hard_killed: bool
    next_call_ms: float  # cancel/deadline -> a small call sent right after it is answered

    @property
    def how(self) -> str:
        """Stopped by a raise (or checkpoint), by a kill, or left to run on."""
        if self.stopped_ms is None:
            return "never"
        if self.hard_killed:
            return "killed"
        return "stopped" if self.stopped_ms < STOPPED_WITHIN_MS else "ran-on"

    def verdict(self) -> str:
        """How, and when Job.stopped_at came after the cancel."""
        return self.how if self.stopped_ms is None else f"{self.how} {self.stopped_ms:.0f} ms"


@dataclass(kw_only=True)
class Subject:
    """A candidate's worker, its Daphne, its client and what was measured."""

    candidate: Candidate
    worker: ManagedProcess
    web: ManagedProcess
    web_port: int
    agent: Agent | None = None
    memory: dict[str, Memory] = field(default_factory=dict)
    round_trips: list[float] = field(default_factory=list)
    busy: list[Stop] = field(default_factory=list)
    block: Stop | None = None
    overrun: Stop | None = None
    long_job: str = ""
    pair: str = ""
    ceiling: str = ""
    kill_errors: int = 0
    still_up: bool = False

    @property
    def client(self) -> Agent:
        """The connected agent."""
        assert self.agent is not None
        return self.agent


def new_subject(candidate: Candidate) -> Subject:
    """A worker and a Daphne for a candidate (not started)."""
    name = f"small-{candidate.pool}{candidate.concurrency}"
    worker = ManagedProcess(
        name,
        python_tool(
            "celery", "-A", "abpsite", "worker", "-Q", candidate.queue,
            "-P", candidate.pool, "-c", str(candidate.concurrency), "-l", "info",
            "-n", f"{name}-{os.getpid()}@%h", "--without-gossip", "--without-mingle",
        ),
        STACK.run_dir,
    )  # fmt: skip
    routes = ",".join(
        f"{name}={candidate.queue}"
        for name in ("convert.markdownToHtml", "test.sleep", "test.allocate")
    )
    port = free_port()
    web = STACK.new_web(port, name=f"daphne-{name}", env={"ABP_CAPABILITY_QUEUES": routes})
    return Subject(candidate=candidate, worker=worker, web=web, web_port=port)


def process_tree(pid: int) -> list[int]:
    """A process and its descendants."""
    found = [pid]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            found += process_tree(int(child))
    return found


def tree_memory(pid: int) -> Memory:
    """RSS, PSS and USS of a process tree, summed from smaps_rollup."""
    totals = {"Rss": 0, "Pss": 0, "Private_Clean": 0, "Private_Dirty": 0}
    pids = process_tree(pid)
    for each in pids:
        for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in totals:
                totals[key] += int(rest.split()[0])
    return Memory(
        processes=len(pids),
        rss=totals["Rss"],
        pss=totals["Pss"],
        uss=totals["Private_Clean"] + totals["Private_Dirty"],
    )


def markdown_call(agent: Agent) -> float:
    """One convert.markdownToHtml round trip, in ms."""
    start = time.perf_counter()
    result = agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN), timeout=30)
    assert result["payload"]["success"] is True, result
    return (time.perf_counter() - start) * 1000


def running(agent: Agent, call_id: str) -> Job:
    """The call's job once a worker runs it."""
    jobs = Job.objects.filter(session_id=agent.session_id, call_id=call_id)
    job: Job = eventually(jobs.filter(status=JobStatus.RUNNING).first, timeout=30)
    return job


def stop_of(job: Job, told_at: float, next_call_ms: float) -> Stop:
    """How a job told to stop at `told_at` ended (waits its length and more)."""
    stopped = Job.objects.filter(pk=job.pk, stopped_at__isnull=False)
    try:
        done: Job = eventually(stopped.first, timeout=SECONDS_OF_WORK + 10)
    except TimeoutError:
        return Stop(stopped_ms=None, hard_killed=False, next_call_ms=next_call_ms)
    assert done.stopped_at is not None
    return Stop(
        stopped_ms=(done.stopped_at.timestamp() - told_at) * 1000,
        hard_killed=done.hard_killed,
        next_call_ms=next_call_ms,
    )


def cancel_running(agent: Agent, params: dict[str, Any], call_id: str) -> Stop:
    """Start a job, cancel it once it runs, then send a small call behind it."""
    call = agent.call("test.sleep", params, call_id=call_id)
    job = running(agent, call_id)
    time.sleep(0.3)
    cancelled_at = time.time()
    start = time.perf_counter()
    agent.cancel(call_id)
    assert agent.result_of(call)["payload"].get("cancelled") is True
    agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN), timeout=SECONDS_OF_WORK + 20)
    next_call_ms = (time.perf_counter() - start) * 1000
    stop = stop_of(job, cancelled_at, next_call_ms)
    agent.inbox.clear()
    return stop


def overrun(agent: Agent) -> Stop:
    """A job stuck in C past its deadline, nobody cancelling: when does it stop?"""
    call = agent.call("test.sleep", BLOCK, call_id="overrun", timeout_ms=DEADLINE_MS)
    job = running(agent, "overrun")
    assert job.deadline is not None
    deadline = job.deadline.timestamp()
    agent.result_of(call, timeout=30)
    agent.result_of(agent.call("convert.markdownToHtml", MARKDOWN), timeout=SECONDS_OF_WORK + 20)
    stop = stop_of(job, deadline, (time.time() - deadline) * 1000)
    agent.inbox.clear()
    return stop


def outcome(payload: dict[str, Any]) -> str:
    """A call-result in a word."""
    if payload.get("cancelled"):
        return "cancelled"
    return "ok" if payload.get("success") else str(payload["error"]["code"])


def long_job(agent: Agent) -> str:
    """A job longer than the heartbeat's staleness limit: does it survive?"""
    call = agent.call("test.sleep", LONG_CHECKPOINTED, call_id="long")
    result = outcome(agent.result_of(call, timeout=30)["payload"])
    agent.inbox.clear()
    return result


def pair(agent: Agent) -> str:
    """Two checkpointed jobs at once; the second is cancelled: how each ends."""
    first = agent.call("test.sleep", LONG_CHECKPOINTED, call_id="pair-1")
    running(agent, "pair-1")
    second = agent.call("test.sleep", LONG_CHECKPOINTED, call_id="pair-2")
    job = running(agent, "pair-2")
    time.sleep(0.3)
    cancelled_at = time.time()
    agent.cancel("pair-2")
    agent.result_of(second)
    stop = stop_of(job, cancelled_at, 0.0)
    kept = outcome(agent.result_of(first, timeout=30)["payload"])
    agent.inbox.clear()
    return f"other: {kept}; cancelled: {stop.verdict()}"


def small_outcome(agent: Agent) -> str:
    """A small call's outcome in a word; "no answer" if none came in 15 s."""
    call = agent.call("convert.markdownToHtml", MARKDOWN)
    try:
        return outcome(agent.result_of(call, timeout=15)["payload"])
    except TimeoutError:
        return "no answer"


def last_critical(log: str) -> str:
    """The message of the last CRITICAL line of a log."""
    lines = [line for line in log.splitlines() if " CRITICAL " in line]
    return lines[-1].split(": ", 1)[-1] if lines else "no CRITICAL line"


def ceiling(subject: Subject) -> str:
    """A job past the memory ceiling, then small calls: outcomes, and the worker's fate."""
    agent = subject.client
    before = set(process_tree(subject.worker.pid))
    call = agent.call("test.allocate", {"mb": ALLOCATION_MB})
    bomb = outcome(agent.result_of(call, timeout=60)["payload"])
    after = "/".join(small_outcome(agent) for _ in range(2))
    agent.inbox.clear()
    assert subject.worker.proc is not None
    code = subject.worker.proc.poll()
    if code is not None:
        fate = f"worker exited ({code}): {last_critical(subject.worker.log_text())}"
    elif set(process_tree(subject.worker.pid)) != before:
        fate = "child replaced"
    else:
        fate = "same process goes on"
    return f"{bomb}; next small calls {after}; {fate}"


def measure_stops(subject: Subject, repeats: int) -> None:
    """Every cancel check and the memory ceiling, on one candidate, the others idle."""
    agent = subject.client
    label = subject.candidate.label
    for n in range(repeats):
        subject.busy.append(cancel_running(agent, BUSY, f"busy-{n}"))
        print(f"  {label}: busy cancel {n}: {subject.busy[-1].verdict()}", flush=True)
    subject.block = cancel_running(agent, BLOCK, "block")
    print(f"  {label}: blocked cancel: {subject.block.verdict()}", flush=True)
    subject.overrun = overrun(agent)
    print(f"  {label}: blocked past its deadline: {subject.overrun.verdict()}", flush=True)
    subject.long_job = long_job(agent)
    print(f"  {label}: long job: {subject.long_job}", flush=True)
    if subject.candidate.concurrency > 1:
        subject.pair = pair(agent)
        print(f"  {label}: two at once: {subject.pair}", flush=True)
    subject.ceiling = ceiling(subject)
    print(f"  {label}: memory ceiling: {subject.ceiling}", flush=True)
    subject.kill_errors = subject.worker.log_text().count("does not implement kill_job")
    subject.still_up = subject.worker.proc is not None and subject.worker.proc.poll() is None


def measure_round_trips(subjects: list[Subject], calls: int, rounds: int = 10) -> None:
    """Interleaved rounds, the order turning each round, so all share the machine."""
    for number in range(rounds):
        turn = number % len(subjects)
        for subject in subjects[turn:] + subjects[:turn]:
            subject.round_trips += [markdown_call(subject.client) for _ in range(calls // rounds)]


def start_subject(subject: Subject) -> None:
    """A candidate's worker and Daphne, its agent connected, warmed up."""
    worker, web, port = subject.worker, subject.web, subject.web_port
    worker.start(lambda: " ready." in worker.log_text())
    web.start(lambda: port_open(port))
    subject.agent = agent = Agent(f"ws://127.0.0.1:{port}/abp/ws")
    agent.initialize()
    for _ in range(20):
        markdown_call(agent)
    agent.result_of(agent.call("test.sleep", {"steps": 0}))
    agent.inbox.clear()


def start(subjects: list[Subject]) -> None:
    """Redis, the reaper's worker, beat, then every candidate."""
    STACK.redis.start(lambda: port_open(STACK.redis_port))
    STACK.small_worker.start(lambda: " ready." in STACK.small_worker.log_text())
    STACK.beat.start(lambda: "beat: Starting" in STACK.beat.log_text())
    for subject in subjects:
        start_subject(subject)


def stop(subjects: list[Subject]) -> None:
    """Stop everything this run started, Redis last."""
    for subject in subjects:
        if subject.agent is not None:
            subject.agent.close()
        subject.web.stop()
        subject.worker.stop()
    for process in (STACK.beat, STACK.small_worker):
        process.stop()
    STACK.redis.stop()


def mib(kib: int) -> str:
    return f"{kib / KIB:8.1f}"


def print_memory(subjects: list[Subject]) -> None:
    print("\n== worker process tree memory, MiB (sum over the main process and its children)")
    print(f"{'pool':<14} {'procs':>5} " + " ".join(f"{h:>8}" for h in ("RSS", "PSS", "USS")))
    for moment in ("idle", "after"):
        print(f"-- {'idle, after warm-up' if moment == 'idle' else 'after the markdown calls'}")
        for subject in subjects:
            m = subject.memory[moment]
            label = subject.candidate.label
            print(f"{label:<14} {m.processes:>5} {mib(m.rss)} {mib(m.pss)} {mib(m.uss)}")


def print_stops(subjects: list[Subject]) -> None:
    print(f"\n== cancels of {SECONDS_OF_WORK} s jobs, the heartbeat, the memory ceiling")
    print(f"   (stopped: by a raise within {STOPPED_WITHIN_MS} ms; killed: by the reaper)")
    for subject in subjects:
        stops = [s.stopped_ms for s in subject.busy if s.stopped_ms is not None]
        hows = "/".join(sorted({s.how for s in subject.busy}))
        timing = f", p50 {stats.summary(stops)['p50']:.0f} ms, max {max(stops):.0f} ms"
        nexts = max(s.next_call_ms for s in subject.busy)
        print(f"-- {subject.candidate.label}")
        print(
            f"   busy loop (no checkpoints), cancel -> stopped_at: {hows}{timing if stops else ''}"
        )
        print(
            f"      n={len(subject.busy)}; cancel -> next small call answered: max {nexts:.0f} ms"
        )
        if subject.block is not None:
            print(f"   C-level sleep, cancel -> stopped_at: {subject.block.verdict()};")
            print(f"      cancel -> next small call answered: {subject.block.next_call_ms:.0f} ms")
        if subject.overrun is not None and subject.overrun.stopped_ms is not None:
            killed = " (hard-killed)" if subject.overrun.hard_killed else ""
            print(
                f"   C-level sleep past a {DEADLINE_MS} ms deadline, no cancel: stopped_at"
                f" {subject.overrun.stopped_ms:.0f} ms after the deadline{killed};"
            )
            print(
                f"      deadline -> next small call answered: {subject.overrun.next_call_ms:.0f} ms"
            )
        print(f"   5 s checkpointed job (needs the heartbeat): {subject.long_job}")
        if subject.pair:
            print(f"   two 5 s jobs at once, the second cancelled: {subject.pair}")
        print(f"   {ALLOCATION_MB} MiB allocation: {subject.ceiling}")
        print(
            f"   worker log: {subject.kill_errors} 'does not implement kill_job' errors;"
            f" worker still up: {'yes' if subject.still_up else 'NO'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cancels", type=int, default=5)
    parser.add_argument("--keep-logs", action="store_true", help="keep the run's directory")
    args = parser.parse_args()
    subjects = [new_subject(candidate) for candidate in CANDIDATES]
    try:
        start(subjects)
        time.sleep(3)  # let start-up work (presence, first reaps) settle
        for subject in subjects:
            subject.memory["idle"] = tree_memory(subject.worker.pid)
        measure_round_trips(subjects, args.calls)
        for subject in subjects:
            subject.memory["after"] = tree_memory(subject.worker.pid)
        for subject in subjects:
            measure_stops(subject, args.cancels)
    except BaseException:
        print(f"logs kept in {STACK.run_dir}", file=sys.stderr)
        raise
    finally:
        stop(subjects)
    print_memory(subjects)
    print(f"\n== convert.markdownToHtml round trip over /abp/ws ({args.calls} calls each)")
    baseline = stats.summary(subjects[0].round_trips)["p50"]
    for subject in subjects:
        print(stats.line(subject.candidate.label, subject.round_trips, baseline))
    print_stops(subjects)
    if args.keep_logs:
        print(f"\nlogs kept in {STACK.run_dir}")
    else:
        STACK.remove_files()


if __name__ == "__main__":
    main()
