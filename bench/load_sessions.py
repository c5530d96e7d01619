"""Many concurrent WebSocket sessions on one Daphne, each with a call, half cancelled.

Opens `--sessions` sessions (default 500) from one asyncio process, each its own
connection, initialized and then left idle; then sends one `test.sleep` call on
every session (about 1 s of work; the worker has 2 processes, so most calls sit
queued) and cancels a random half at a random moment of the first seconds. The
other half sends, at moments drawn the same way, a frame the consumer answers at
once (a second `initialize`), as the RTT baseline under the same load.

Checks that every call got exactly one call-result, every cancel exactly one
cancel-result, that the cancelled:true cancel-results are exactly the cancelled
call-results (each sent after its cancel-result), and that every other call
succeeded. Prints Daphne's memory per idle session, the time to answer
everything, and the cancel latencies under that load.

Run: .venv/bin/python bench/load_sessions.py [--sessions 500] [--seed 1]
Exits 1 if a call or cancel went unanswered or was answered twice, or a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

# The production grace period (60 s), not the test stack's 5 s.
STACK = environment.prepare("abp-bench-load-", ABP_RESUME_GRACE_SECONDS="60")

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from bench import stats  # noqa: E402
from tests.support.agent import envelope  # noqa: E402

Envelope = dict[str, Any]

STEP_MS = 50
# Handshakes in progress at once: Daphne listens with Twisted's default backlog (50),
# and a SYN dropped past it is retried after a second: that would time the kernel.
CONNECT_GATE = 50
IDLE_SECONDS = 10.0


INITIALIZE = {
    "agent": {"name": "load-bench", "version": "1.0"},
    "protocolVersion": "0.1",
    "features": {"notifications": False, "progress": False},
}


@dataclass
class Session:
    """One connection and everything it sent and received (perf_counter seconds)."""

    index: int
    ws: ClientConnection
    connect_ms: float
    cancel_delay: float | None = None  # seconds after the call; None: never cancelled
    probe_delay: float | None = None  # the same, for the RTT probe of uncancelled ones
    call_sent: float = 0.0
    cancel_sent: float | None = None
    probe_sent: float | None = None
    received: list[tuple[float, Envelope]] = field(default_factory=list)
    closing: bool = False
    closed_by_server: int | None = None

    @property
    def call_id(self) -> str:
        """The callId of this session's call (scoped to the session anyway)."""
        return f"load-{self.index}"

    def of(self, message_type: str, message_id: str) -> list[tuple[float, Envelope]]:
        """The received messages of a type replying to an id."""
        return [
            (t, e) for t, e in self.received if e["type"] == message_type and e["id"] == message_id
        ]

    def answered(self) -> bool:
        """Whether everything it sent has had its reply."""
        if self.closed_by_server is not None:
            return True
        if not self.of("capabilities/call-result", "call"):
            return False
        if self.cancel_delay is not None:
            return self.cancel_sent is not None and bool(
                self.of("capabilities/cancel-result", "cancel")
            )
        if self.probe_delay is not None:
            return self.probe_sent is not None and bool(self.of("initialize-result", "probe"))
        return True


async def open_session(index: int, url: str, gate: asyncio.Semaphore) -> Session:
    """Connect with the suite's agent key and initialize."""
    headers = {"Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}"}
    async with gate:
        start = time.perf_counter()
        ws = await connect(
            url,
            max_size=None,
            additional_headers=headers,
            proxy=None,
            ping_interval=None,  # idle means idle; Daphne's own pings still flow
            open_timeout=60,
        )
        await ws.send(envelope("initialize", "init", INITIALIZE))
        reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
        elapsed = (time.perf_counter() - start) * 1000
    if reply["type"] != "initialize-result" or "error" in reply:
        raise RuntimeError(f"session {index}: initialize failed: {reply}")
    return Session(index=index, ws=ws, connect_ms=elapsed)


async def read(session: Session, clock: list[float]) -> None:
    """Keep every frame with its arrival time; note a close we did not ask for."""
    try:
        async for frame in session.ws:
            now = time.perf_counter()
            session.received.append((now, json.loads(frame)))
            clock[0] = now
    except ConnectionClosed:
        pass
    if not session.closing:
        session.closed_by_server = session.ws.close_code or -1


async def drive(session: Session, call_ms: int) -> None:
    """Send the call, then the cancel (or the probe) after its delay."""
    params = {"steps": call_ms // STEP_MS, "stepMs": STEP_MS}
    options = {"callId": session.call_id}
    frame = envelope(
        "capabilities/call",
        "call",
        {"capability": "test.sleep", "params": params, "options": options},
    )
    session.call_sent = time.perf_counter()
    await session.ws.send(frame)
    if session.cancel_delay is not None:
        await asyncio.sleep(session.cancel_delay)
        frame = envelope("capabilities/cancel", "cancel", {"callId": session.call_id})
        session.cancel_sent = time.perf_counter()
        await session.ws.send(frame)
    elif session.probe_delay is not None:
        await asyncio.sleep(session.probe_delay)
        frame = envelope("initialize", "probe", INITIALIZE)  # answered ALREADY_INITIALIZED
        session.probe_sent = time.perf_counter()
        await session.ws.send(frame)


def rss_kib(pid: int) -> int:
    """A process's resident set size (VmRSS), in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_open_file_limit(sessions: int) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE for this process and the stack it starts.

    The client holds a socket per session and so does Daphne; both inherit this
    limit. Returns (before, after).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * sessions + 1024
    if hard != resource.RLIM_INFINITY and hard < 2 * sessions + 256:
        raise SystemExit(f"open-file hard limit {hard} is too low for {sessions} sessions")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return soft, new
    return soft, soft


@dataclass
class Figures:
    """What one run measured, besides the sessions themselves."""

    cpu_idle: float = 0.0  # Daphne's CPU seconds per second with the sessions idle
    rss_before: int = 0
    rss_idle: int = 0
    rss_in_flight: int = 0  # right after every call and cancel was sent
    rss_peak: int = 0
    rss_closed: int = 0
    open_seconds: float = 0.0
    cpu_sending: float = 0.0  # Daphne's CPU seconds while the calls and cancels went out
    cpu_seconds: float = 0.0  # ... from the first call until every answer was in
    sending_seconds: float = 0.0
    first_call: float = 0.0
    waited_out: bool = False
    # (when, ms): how late this process's own event loop woke up during the call phase,
    # the client's share of the latencies measured then.
    client_lag: list[tuple[float, float]] = field(default_factory=list)


async def watch_loop(lags: list[tuple[float, float]], period: float = 0.01) -> None:
    """Record how late each short sleep of this event loop ends, until cancelled."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(period)
        now = time.perf_counter()
        lags.append((now, (now - start - period) * 1000))


async def run(args: argparse.Namespace, figures: Figures) -> list[Session]:
    rng = random.Random(args.seed)
    pid = STACK.web.pid
    gate = asyncio.Semaphore(CONNECT_GATE)
    # Warm Daphne up (imports, DB and Redis connections, the worker) before the baseline.
    warm = await open_session(-1, STACK.ws_url, gate)
    await warm.ws.send(
        envelope("capabilities/call", "call", {"capability": "test.sleep", "params": {"steps": 0}})
    )
    while json.loads(await warm.ws.recv())["type"] != "capabilities/call-result":
        pass
    await warm.ws.close()
    await asyncio.sleep(1.0)
    figures.rss_before = rss_kib(pid)

    start = time.perf_counter()
    sessions = list(
        await asyncio.gather(*(open_session(i, STACK.ws_url, gate) for i in range(args.sessions)))
    )
    figures.open_seconds = time.perf_counter() - start
    clock = [time.perf_counter()]
    readers = [asyncio.create_task(read(s, clock)) for s in sessions]
    await asyncio.sleep(2.0)  # idle: let Daphne settle after the handshakes
    cpu_start = cpu_seconds(pid)
    await asyncio.sleep(IDLE_SECONDS)
    figures.cpu_idle = (cpu_seconds(pid) - cpu_start) / IDLE_SECONDS
    figures.rss_idle = rss_kib(pid)
    print(f"  {len(sessions)} sessions open and idle", flush=True)

    for session in rng.sample(sessions, len(sessions) // 2):
        session.cancel_delay = rng.uniform(0, args.cancel_window)
    for session in sessions:
        if session.cancel_delay is None:
            session.probe_delay = rng.uniform(0, args.cancel_window)
    cpu_start = cpu_seconds(pid)
    watcher = asyncio.create_task(watch_loop(figures.client_lag))
    figures.first_call = time.perf_counter()
    drivers = [asyncio.create_task(drive(s, args.call_ms)) for s in sessions]
    await asyncio.gather(*drivers)
    figures.cpu_sending = cpu_seconds(pid) - cpu_start
    figures.sending_seconds = time.perf_counter() - figures.first_call
    figures.rss_in_flight = figures.rss_peak = rss_kib(pid)
    print("  every call and cancel sent; waiting for the answers", flush=True)

    clock[0] = time.perf_counter()
    while not all(s.answered() for s in sessions):
        if time.perf_counter() - clock[0] > args.stall_timeout:
            figures.waited_out = True
            break
        await asyncio.sleep(0.05)
        figures.rss_peak = max(figures.rss_peak, rss_kib(pid))
    figures.cpu_seconds = cpu_seconds(pid) - cpu_start
    watcher.cancel()
    await asyncio.sleep(args.linger)  # anything arriving now is a duplicate
    for session in sessions:
        session.closing = True
    await asyncio.gather(*(s.ws.close() for s in sessions))
    await asyncio.gather(*readers)
    await asyncio.sleep(2.0)
    figures.rss_closed = rss_kib(pid)
    return sessions


def check(session: Session) -> list[str]:
    """What is wrong with one session's exchange (nothing, if all went right)."""
    problems = []
    if session.closed_by_server is not None:
        problems.append(f"closed by the server with {session.closed_by_server}")
    calls = session.of("capabilities/call-result", "call")
    if len(calls) != 1:
        problems.append(f"{len(calls)} call-results")
    cancels = session.of("capabilities/cancel-result", "cancel")
    if session.cancel_sent is not None and len(cancels) != 1:
        problems.append(f"{len(cancels)} cancel-results")
    probes = session.of("initialize-result", "probe")
    if session.probe_sent is not None and len(probes) != 1:
        problems.append(f"{len(probes)} probe replies")
    known = {"capabilities/call-result", "capabilities/cancel-result", "initialize-result"}
    for _, other in session.received:
        if other["type"] not in known:
            problems.append(f"unexpected {other['type']}: {other['payload']}")
    if len(calls) != 1:
        return problems
    call_at, call = calls[0]
    if call["payload"].get("callId") != session.call_id:
        problems.append(f"call-result for {call['payload'].get('callId')}")
    cancelled = bool(call["payload"].get("cancelled"))
    if len(cancels) == 1:
        cancel_at, cancel = cancels[0]
        if bool(cancel["payload"].get("cancelled")) != cancelled:
            problems.append(f"cancel-result {cancel['payload']} but call-result {call['payload']}")
        if cancelled and call_at < cancel_at:
            problems.append("cancelled call-result before its cancel-result")
    if cancelled:
        code = (call["payload"].get("error") or {}).get("code")
        if session.cancel_sent is None or code != "CANCELLED":
            problems.append(f"cancelled without a cancel: {call['payload']}")
    elif call["payload"].get("success") is not True:
        problems.append(f"call failed: {call['payload'].get('error')}")
    return problems


# A log record's first line (settings.LOGGING's format), and an exception's last line.
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([A-Z]+) (.*)$")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*: ")


def log_problems(name: str, text: str) -> None:
    """Print how many warnings, errors and tracebacks a process logged, commonest first."""
    records: list[tuple[str, str]] = []  # (level, message)
    raised: dict[int, str] = {}  # record index -> the exception its traceback ended with
    in_traceback = False
    for line in text.splitlines():
        match = LOG_RECORD.match(line)
        if match:
            records.append((match[1], match[2]))
            in_traceback = False
        elif line.startswith("Traceback"):
            in_traceback = True
            raised[len(records) - 1] = "a traceback"
        elif in_traceback and EXCEPTION_LINE.match(line):
            raised[len(records) - 1] = line.strip()
    shapes: Counter[str] = Counter()
    for index, (level, message) in enumerate(records):
        if level in {"WARNING", "ERROR", "CRITICAL"} or index in raised:
            # Ids and numbers out, so that the same message counts once.
            shape = re.sub(r"[0-9a-f-]{8,}|\d+", "#", f"{level} {message}")[:110]
            shapes[f"{shape}  <- {raised[index]}" if index in raised else shape] += 1
    print(f"   {name}.log: {shapes.total()} warnings or errors")
    for shape, count in shapes.most_common(5):
        print(f"     {count:>5}x {shape}")


def exactly_once(sessions: list[Session]) -> int:
    """Print the sessions that failed a check and why; returns how many failed."""
    failed = 0
    kinds: Counter[str] = Counter()
    for session in sessions:
        problems = check(session)
        if problems:
            failed += 1
            kinds.update(re.sub(r"\{.*", "...", p) for p in problems)
            if failed <= 10:
                print(f"   session {session.index}: {'; '.join(problems)}")
    n = len(sessions)
    print(f"   sessions with every call and cancel answered exactly once: {n - failed} of {n}")
    for kind, count in kinds.most_common():
        print(f"     {count:>5}x {kind}")
    return failed


@dataclass
class Timings:
    """Latencies (ms) and times (perf_counter s) taken from the sessions' frames."""

    to_confirm: list[float] = field(default_factory=list)
    to_result: list[float] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    uncancelled_calls: list[float] = field(default_factory=list)
    confirmed: int = 0
    too_late: int = 0
    last_answer: float = 0.0
    last_cancel_answer: float = 0.0
    last_quick_reply: float = 0.0  # the last cancel-result or probe reply


def timings(sessions: list[Session]) -> Timings:
    """Each session's first reply to each of its messages, timed from the send."""
    t = Timings()
    for session in sessions:
        t.last_answer = max([t.last_answer, *(at for at, _ in session.received)])
        calls = session.of("capabilities/call-result", "call")
        cancels = session.of("capabilities/cancel-result", "cancel")
        probes = session.of("initialize-result", "probe")
        if calls and session.cancel_sent is None:
            t.uncancelled_calls.append((calls[0][0] - session.call_sent) * 1000)
        if probes and session.probe_sent is not None:
            t.probes.append((probes[0][0] - session.probe_sent) * 1000)
            t.last_quick_reply = max(t.last_quick_reply, probes[0][0])
        if not cancels or session.cancel_sent is None:
            continue
        t.to_confirm.append((cancels[0][0] - session.cancel_sent) * 1000)
        t.last_quick_reply = max(t.last_quick_reply, cancels[0][0])
        if not cancels[0][1]["payload"].get("cancelled"):
            t.too_late += 1
            continue
        t.confirmed += 1
        if calls:
            t.to_result.append((calls[0][0] - session.cancel_sent) * 1000)
            t.last_cancel_answer = max(t.last_cancel_answer, calls[0][0])
    return t


def by_moment(sessions: list[Session], first_call: float, window: float) -> None:
    """Cancel latencies and frame RTTs by when they were sent: during the calls' burst or after."""
    print("   by when they were sent, in s after the first call:")
    for low in range(math.ceil(window)):
        label = f"sent at {low}-{low + 1} s"
        cancels, probes = [], []
        for s in sessions:
            cancel = s.of("capabilities/cancel-result", "cancel")
            if s.cancel_sent is not None and cancel and low <= s.cancel_sent - first_call < low + 1:
                cancels.append((cancel[0][0] - s.cancel_sent) * 1000)
            probe = s.of("initialize-result", "probe")
            if s.probe_sent is not None and probe and low <= s.probe_sent - first_call < low + 1:
                probes.append((probe[0][0] - s.probe_sent) * 1000)
        if probes:
            print(stats.line(f"   frame RTT, {label}", probes))
        if cancels:
            print(stats.line(f"   cancel -> cancel-result, {label}", cancels))


def report(sessions: list[Session], figures: Figures, args: argparse.Namespace) -> int:
    """Print the figures; returns how many sessions failed a check."""
    n = len(sessions)
    mib = 1024
    print(f"\n== {n} sessions on one Daphne (seed {args.seed})")
    print(f"   open + initialize all: {figures.open_seconds:.2f} s ({CONNECT_GATE} at a time)")
    print(stats.line("connect + initialize, per session", [s.connect_ms for s in sessions]))
    print(f"   Daphne RSS before (warmed up): {figures.rss_before / mib:.1f} MiB")
    print(f"   Daphne RSS with {n} idle sessions: {figures.rss_idle / mib:.1f} MiB")
    per_session = (figures.rss_idle - figures.rss_before) / n
    print(f"   memory per idle session: {per_session:.1f} KiB")
    print(f"   Daphne CPU with {n} idle sessions: {figures.cpu_idle:.1%} of a core")
    print(
        f"   Daphne RSS with the calls in flight: {figures.rss_in_flight / mib:.1f} MiB"
        f" (all sent), peak {figures.rss_peak / mib:.1f} MiB"
    )
    print(f"   Daphne RSS 2 s after every socket closed: {figures.rss_closed / mib:.1f} MiB")

    t = timings(sessions)
    print(f"\n== {n} calls of test.sleep ({args.call_ms} ms of work each), 2 worker processes")
    print(f"   first call sent -> last answer received: {t.last_answer - figures.first_call:.2f} s")
    if t.last_cancel_answer:
        elapsed = t.last_cancel_answer - figures.first_call
        print(f"   first call sent -> last cancelled call answered: {elapsed:.2f} s")
    print(
        f"   Daphne CPU time until every answer was in: {figures.cpu_seconds:.2f} s,"
        f" of which {figures.cpu_sending:.2f} s in the {figures.sending_seconds:.1f} s"
        " the calls and cancels took to send"
    )
    print(
        f"   cancels sent: {len(t.to_confirm)}, 0-{args.cancel_window:g} s after their call;"
        f" cancelled: true: {t.confirmed}; false (already finished): {t.too_late}"
    )
    if t.uncancelled_calls:
        print(stats.line("uncancelled call -> its result (queue + work)", t.uncancelled_calls))
    if t.probes:
        print(stats.line("consumer frame RTT under the same load", t.probes))
    if t.to_confirm:
        baseline = stats.summary(t.probes)["p50"] if t.probes else None
        print(stats.line("cancel -> cancel-result (vs frame RTT)", t.to_confirm, baseline))
    if t.to_result:
        print(stats.line("cancel -> call-result (cancelled: true)", t.to_result))
    by_moment(sessions, figures.first_call, args.cancel_window)
    lags = [lag for at, lag in figures.client_lag if at <= t.last_quick_reply]
    if lags:
        print(stats.line("client event-loop lag, until the last of those", lags))

    print("\n== exactly once")
    if figures.waited_out:
        print(f"   gave up waiting: no frame for {args.stall_timeout:g} s")
    failed = exactly_once(sessions)
    print("\n== logs")
    for process in (STACK.web, STACK.worker, STACK.beat):
        log_problems(process.name, process.log_text())
    return failed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--call-ms", type=int, default=1000, help="work per call")
    parser.add_argument(
        "--cancel-window", type=float, default=3.0, help="cancels land 0..this s after the call"
    )
    parser.add_argument(
        "--stall-timeout", type=float, default=60.0, help="give up after this long without a frame"
    )
    parser.add_argument(
        "--linger", type=float, default=3.0, help="keep reading this long to catch duplicates"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run dir (logs, DB)")
    args = parser.parse_args()
    before, after = raise_open_file_limit(args.sessions)
    print(f"  open-file limit: {before} -> {after}", flush=True)
    figures = Figures()
    failed = 1
    try:
        STACK.start()
        sessions = asyncio.run(run(args, figures))
        failed = report(sessions, figures, args)
    finally:
        STACK.stop()
        if args.keep or failed:
            print(f"\n   run dir kept: {STACK.run_dir}")
        else:
            STACK.remove_files()
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
