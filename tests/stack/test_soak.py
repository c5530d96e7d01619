"""The soak (bench/soak.py) as CI runs it: three minutes with seed 7, every door and every
kind of fault, on a private PostgreSQL cluster; any violated invariant fails it.

The report (JSON) and every process's log are kept in var/test-artifacts/soak/.
Only the PostgreSQL pass runs it (`postgres` marker); it needs PostgreSQL 15's binaries
(tests/support/postgres_server.py), HAProxy and Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from tests.support import postgres_server
from tests.support.paths import ROOT
from tests.support.soak.doors.rpc import RpcCall, to_send_again
from tests.support.soak.faults import Fault, Injector, Kind, schedule
from tests.support.soak.invariants import check
from tests.support.soak.ledger import Answer, Ledger, Moment, Op
from tests.support.soak.main import run_soak
from tests.support.soak.memory import Sample, slopes
from tests.support.soak.relay import RedisRelay
from tests.support.soak.rows import COLUMNS, JobHistory, RowWatch, busy_percent
from tests.support.soak.run import Options

DEFAULT_ARTIFACTS = ROOT / "var" / "test-artifacts"
ARTIFACTS = Path(os.environ.get("ABP_TEST_ARTIFACTS", DEFAULT_ARTIFACTS)) / "soak"
OPTIONS = Options(
    minutes=3, seed=7, command="tests/stack/test_soak.py: bench/soak.py --minutes 3 --seed 7"
)


@pytest.mark.postgres
@pytest.mark.timeout(330)
def test_three_minutes_of_load_and_faults_break_no_invariant() -> None:
    unavailable = postgres_server.available()
    if unavailable:
        pytest.fail(unavailable)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outcome = run_soak(OPTIONS, report_path=ARTIFACTS / "report.json", logs=ARTIFACTS / "logs")
    report = outcome.report

    assert report["harness_errors"] == []
    injected = {kind for kind, entry in report["faults_by_kind"].items() if entry["injected"]}
    assert injected == {kind.value for kind in Kind}
    failed = [f for f in report["faults"] if f["error"]]
    assert failed == []
    for door in ("abp", "rpc", "mcp2025", "mcp2026", "client", "browser"):
        assert report["operations"][door]["answers"] > 0, door
    by_invariant = "\n".join(
        f"  {n} {name}" for name, n in report["violations_by_invariant"].items()
    )
    first = "\n".join(f"  {v.tags}: {v.detail}" for v in outcome.violations[:10])
    assert outcome.violations == [], (
        f"{len(outcome.violations)} violations (report.json has each call's timeline):\n"
        f"{by_invariant}\nfirst:\n{first}"
    )


def test_the_checks_catch_what_they_must() -> None:
    """The invariants themselves, on made-up calls and rows: each kind of wrong is reported."""
    ledger = Ledger()
    rows = RowWatch("postgresql://unused", ledger, retention=150, bound=240)
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def row(tag: str, status: str, **fields: Any) -> tuple[Any, ...]:
        values: dict[str, Any] = {
            "id": f"job-{tag}", "tag": tag, "status": status, "error_code": "",
            "cancel_source": "", "created_at": now - timedelta(seconds=60), "started_at": None,
            "settled_at": None, "stopped_at": None, "deadline": None, "worker": "",
            "session_id": "s",
        }  # fmt: skip
        values.update(fields)
        return (*(values[name] for name in COLUMNS), now)

    def op(tag: str, *answers: str, **fields: Any) -> Op:
        made = Op("abp", tag, "test.sleep", None, None, 1.0, session="s")
        for outcome in answers:
            made.answers.append(Answer(2.0, outcome, {}))
        for name, value in fields.items():
            setattr(made, name, value)
        ledger.ops.append(made)
        return made

    settled = now - timedelta(seconds=30)
    cases = {
        # tag: (the call, its row or None, the invariant expected or None)
        "ok": (op("ok", "succeeded"), row("ok", "succeeded", settled_at=settled), None),
        "told": (op("told", told="resume refused"), None, None),
        "none": (op("none"), None, "answered exactly once"),
        "twice": (op("twice", "succeeded", "succeeded"), None, "answered exactly once"),
        "disagrees": (
            op("disagrees", "succeeded"), row("disagrees", "failed", settled_at=settled),
            "answers agree with their job",
        ),
        "uncalled": (
            op("uncalled", "cancelled"), row("uncalled", "cancelled", settled_at=settled),
            "answers agree with their job",
        ),
        "starved": (
            op("starved", "timeout", timeout_ms=32000, cancelled_at=None),
            row("starved", "cancelled", settled_at=settled), "calls make progress",
        ),
        "late": (
            op("late", "succeeded", late_progress=[9.0]),
            row("late", "succeeded", settled_at=settled), "no work runs for a settled job",
        ),
        "overdue": (
            op("overdue", told="gone"),
            row("overdue", "queued", deadline=now - timedelta(seconds=60)),
            "no job is non-terminal past its deadline plus the grace",
        ),
        "unstopped": (
            op("unstopped", "cancelled", cancelled_at=1.5),
            row("unstopped", "cancelled", started_at=settled, settled_at=settled),
            "no work runs for a settled job",
        ),
        "lost": (
            op("lost", "succeeded"), row("lost", "succeeded", settled_at=settled),
            "no job row is lost or duplicated",
        ),
        "crossed": (
            op("crossed", "succeeded"), row("crossed", "succeeded", settled_at=settled),
            "no answer goes to another session",
        ),
        "old": (
            op("old", "succeeded"), row("old", "succeeded", settled_at=now - timedelta(hours=1)),
            "rows stay bounded by retention",
        ),
        # A cancel that won the call's start: answered cancelled, and no row written.
        "unwritten": (
            op("unwritten", "cancelled", cancelled_at=1.5), None,
            "a cancelled call's row is written settled",
        ),
        # Its resume refused within the grace: its calls told so, the session lost.
        "stranded": (
            op("stranded", told="resume refused: SESSION_INVALID", session="s2"), None,
            "a resume within its grace succeeds",
        ),
        "revoked": (op("revoked", told="resume refused: PERMISSION_DENIED", session="s3"), None,
                    None),
    }  # fmt: skip
    rows._observe([r for _, r, _ in cases.values() if r is not None], 5.0)
    rows._observe([r for tag, (_, r, _) in cases.items() if r is not None and tag != "lost"], 8.0)
    cases["crossed"][0].answers[0].data_ok = False
    refused = {"s2": "resume refused: SESSION_INVALID", "s3": "resume refused: PERMISSION_DENIED"}
    violations = check(
        ledger.ops, rows, revoked={"s3"}, strays=["a frame of no call"], refused=refused
    )

    found: dict[str, set[str]] = {}
    for violation in violations:
        for tag in violation.tags or ["-"]:
            found.setdefault(tag, set()).add(violation.invariant)
    for tag, (_, _, expected) in cases.items():
        if expected is None:
            assert tag not in found, (tag, found.get(tag))
        else:
            assert expected in found.get(tag, set()), (tag, found.get(tag))
    assert "no answer goes to another session" in found["-"]


def test_the_schedule_has_every_kind_or_with_no_rate_nothing() -> None:
    """Every kind of fault at least once, in the window; a rate of 0: a run with none."""
    stack: Any = SimpleNamespace(topology=None)
    targets = {kind: "x" for kind in Kind}
    with mock.patch("tests.support.soak.faults.target_of", lambda kind, *_: targets[kind]):
        faults = schedule(random.Random(2), stack, start=15, end=150, per_minute=4)
        none = schedule(random.Random(2), stack, start=15, end=150, per_minute=0)
    assert {fault.kind for fault in faults} == set(Kind)
    assert len(faults) == len(Kind)  # 9 by the rate, but each kind at least once
    assert all(15 <= fault.at <= 150 for fault in faults)
    assert none == []


def _lives(role: str, *, restart_every: float, base_kib: int, fill_kib: int, climb_kib: int = 0,
           leak_kib_per_1000: float = 0.0, seconds: float = 3600) -> list[Sample]:  # fmt: skip
    """A role's samples every 5 s, 800 calls a minute: each process fills `fill_kib` over
    its first 3 minutes, leaks as asked, and each restart starts `climb_kib` higher."""
    samples = []
    for step in range(int(seconds / 5) + 1):
        at = step * 5.0
        life = int(at // restart_every)
        age, calls = at - life * restart_every, int(at * 800 / 60)
        age_calls = age * 800 / 60
        rss = base_kib + life * climb_kib + fill_kib * min(age / 180, 1.0)
        rss += leak_kib_per_1000 * age_calls / 1000
        samples.append(Sample(at, calls, role, role, 1000 + life, int(rss)))
    return samples


def test_the_memory_judges_tell_a_new_process_filling_up_from_memory_that_grows() -> None:
    lives = [
        # Restarted every 3 minutes by faults, filling 134 -> 145 MiB each time.
        _lives("filling", restart_every=180, base_kib=134 << 10, fill_kib=11 << 10),
        # One process all hour, 2 MiB more per 1,000 calls.
        _lives("leaking", restart_every=4000, base_kib=100 << 10, fill_kib=0,
               leak_kib_per_1000=2048),
        # Restarted as often, but each new one starts 4 MiB higher.
        _lives("climbing", restart_every=180, base_kib=100 << 10, fill_kib=0, climb_kib=4096),
        # All hour, filled up and then flat.
        _lives("steady", restart_every=4000, base_kib=120 << 10, fill_kib=8 << 10),
    ]  # fmt: skip
    samples = sorted((s for life in lives for s in life), key=lambda sample: sample.at)
    by_role = {m.role: m for m in slopes(samples)}

    filling, leaking, climbing, steady = (
        by_role[r] for r in ("filling", "leaking", "climbing", "steady")
    )
    assert filling.judged == climbing.judged == 0  # no life long enough for its own slope
    assert (filling.flat, leaking.flat, climbing.flat, steady.flat) == (True, False, False, True)
    assert (filling.ceiling_growth or 0) < 50
    assert 1900 < (leaking.median or 0) < 2200
    assert (climbing.ceiling_growth or 0) > 1024
    assert steady.median == 0.0
    # Ten minutes: too short to compare ceilings, and no life long enough either.
    short = slopes(_lives("short", restart_every=180, base_kib=1 << 20, fill_kib=0, seconds=600))
    assert short[0].flat is None


def test_the_heavy_workers_busy_share_counts_their_jobs_runs_over_their_slots() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)

    def ran(worker: str, start: float, end: float) -> JobHistory:
        row = {"worker": worker, "started_at": at + timedelta(seconds=start),
               "settled_at": at + timedelta(seconds=end), "stopped_at": None}  # fmt: skip
        return JobHistory(row)

    jobs = {
        "a": ran("heavy@node1:1", 0, 10),
        "b": ran("heavy@node2:2", 0, 5),
        "c": ran("small@node1:3", 0, 100),  # another queue's
        "d": JobHistory(
            {"worker": None, "started_at": None, "settled_at": None, "stopped_at": None}
        ),
    }
    assert busy_percent(jobs, "heavy@", slots=2) == 75.0
    assert busy_percent({}, "heavy@", slots=2) is None


def test_the_json_rpc_driver_sends_again_only_what_died_with_an_earlier_socket() -> None:
    def call(tag: str, socket: int, *, sending: bool = False, answered: bool = False) -> RpcCall:
        op = Op("rpc", tag, "test.sleep", None, None, 0.0)
        if answered:
            op.answers.append(Answer(1.0, "succeeded", {}, True))
        return RpcCall(op, {}, [1], socket, sending)

    calls = [
        call("lost", 13),
        call("held", 13),
        call("answered", 13, answered=True),
        call("sent-on-this-socket", 14),  # sent while the resume was under way
        call("waiting-for-a-socket", 13, sending=True),  # its own send goes out on 14
        call("never-sent", 0),
    ]
    again = to_send_again(calls, held={"held"}, connection=14)
    assert [c.op.tag for c in again] == ["lost"]


def test_the_redis_relay_refuses_connections_then_accepts_them_again() -> None:
    """Refusing: a connection it carried is reset, a new one refused (ECONNREFUSED)."""
    with contextlib.ExitStack() as sockets:
        redis_side = sockets.enter_context(socket.create_server(("127.0.0.1", 0)))
        relay = RedisRelay(redis_side.getsockname()[1])
        sockets.callback(relay.close)
        daphne = sockets.enter_context(socket.create_connection(("127.0.0.1", relay.port), 5))
        upstream = sockets.enter_context(redis_side.accept()[0])
        daphne.sendall(b"PING")
        assert upstream.recv(4) == b"PING"

        relay.refuse()
        with pytest.raises(ConnectionResetError):
            daphne.recv(4)  # blocks until the relay's thread resets it
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        assert relay.refused_at is not None

        relay.accept_again()
        again = sockets.enter_context(_connect_when_listening(relay.port))
        upstream = sockets.enter_context(redis_side.accept()[0])
        again.sendall(b"PING")
        assert upstream.recv(4) == b"PING"


def _connect_when_listening(port: int) -> socket.socket:
    """A connection, once the port listens again (the relay's thread opens it in its next round)."""
    for _ in range(100):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            time.sleep(0.02)
    raise AssertionError(f"port {port} never listened again")


class _Relay:
    """The relay's refusing half, as the injector drives it."""

    def __init__(self) -> None:
        self.refused_at: float | None = None
        self.began = threading.Event()
        self.calls: list[str] = []

    def refuse(self) -> None:
        self.calls.append("refuse")
        self.refused_at = time.monotonic()
        self.began.set()

    def accept_again(self) -> None:
        self.calls.append("accept again")
        self.began.clear()


def test_an_aimed_fault_waits_for_its_moment_and_says_which_it_hit() -> None:
    """Redis refused, a call that goes out with its cancel due within 250 ms keeps it
    refused until its cancel was sent; one whose cancel comes later, or a moment of
    another kind, is not it."""
    ledger = Ledger()
    relay = _Relay()
    injector = Injector(SimpleNamespace(relay=relay), ledger, random.Random(1))  # type: ignore[arg-type]
    fault = Fault(0.0, Kind.REDIS_REFUSED_AT_CANCEL, "relay", 1.0)
    aimed_at = Op("rpc", "rpc-2", "test.sleep", "queued", None, 0.0)

    async def load() -> None:
        await asyncio.sleep(0.05)
        ledger.reached(Moment.RESUME_SENT, "rpc session", session="s")
        ledger.reached(Moment.CANCEL_DUE, "rpc-1", op=Op("rpc", "rpc-1", "x", "", None, 0.0),
                       cancel_in=0.5)  # fmt: skip
        ledger.reached(Moment.CANCEL_DUE, "rpc-2", op=aimed_at, cancel_in=0.16)
        await asyncio.sleep(0.16)
        aimed_at.cancelled_at = ledger.now()
        ledger.answer(aimed_at, "cancelled", {})

    async def both() -> None:
        await asyncio.gather(injector._one(0, fault), load())

    asyncio.run(both())
    assert fault.error == ""
    assert relay.calls == ["refuse", "accept again"]
    assert "hit rpc-2 at " in fault.note, fault.note
    assert "its cancel due 160 ms later" in fault.note
    assert f"its cancel sent at {aimed_at.cancelled_at} s; answered cancelled" in fault.note


def test_an_aimed_fault_notes_that_no_moment_came_within_its_hold() -> None:
    ledger = Ledger()
    relay = _Relay()
    injector = Injector(SimpleNamespace(relay=relay), ledger, random.Random(1))  # type: ignore[arg-type]
    fault = Fault(0.0, Kind.REDIS_REFUSED_AT_CANCEL, "relay", 0.05)

    asyncio.run(injector._one(0, fault))

    assert relay.calls == ["refuse", "accept again"]
    assert fault.note.startswith("a call sent, its cancel due: none while refused"), fault.note
    ledger.reached(Moment.CANCEL_DUE, "late", cancel_in=0.1)  # the watch given up: no one told


def test_the_redis_relay_refuses_at_the_command_it_waits_for() -> None:
    """Commands without every marker pass; the one with them never reaches Redis: its
    connection is reset there and then, and new ones are refused."""
    with contextlib.ExitStack() as sockets:
        redis_side = sockets.enter_context(socket.create_server(("127.0.0.1", 0)))
        relay = RedisRelay(redis_side.getsockname()[1])
        sockets.callback(relay.close)
        daphne = sockets.enter_context(socket.create_connection(("127.0.0.1", relay.port), 5))
        upstream = sockets.enter_context(redis_side.accept()[0])
        relay.refuse_at(b"PUBLISH", b"abp.session.1")

        daphne.sendall(b"SUBSCRIBE abp.session.1\r\n")
        assert upstream.recv(64) == b"SUBSCRIBE abp.session.1\r\n"
        daphne.sendall(b"PUBLISH abp.session.2 x\r\n")
        assert upstream.recv(64) == b"PUBLISH abp.session.2 x\r\n"
        assert not relay.began.is_set()

        daphne.sendall(b"PUBLISH abp.session.1 x\r\n")
        with pytest.raises(ConnectionResetError):
            daphne.recv(4)
        with pytest.raises(ConnectionResetError):
            upstream.recv(64)  # Redis's end is reset too
        assert relay.began.is_set()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay.port), timeout=5)
