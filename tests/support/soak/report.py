"""The soak's report, Jepsen-style: operations, faults, violations (each with its calls'
timelines), memory, rows; as text for the terminal and as JSON for a file."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any

from tests.support.soak.faults import AIMED, Fault
from tests.support.soak.invariants import Violation
from tests.support.soak.ledger import Ledger
from tests.support.soak.memory import BOUND_KIB_PER_1000_CALLS, RoleSlope
from tests.support.soak.rows import RowWatch

TIMELINES_SHOWN = 12  # violations printed with their timelines (the JSON has them all)


def schedule_lines(faults: list[Fault]) -> list[str]:
    """The fault schedule, one line each."""
    return [f"  {f.at:8.2f} s  {f.kind.value} ({f.target}, {f.hold} s)" for f in faults]


def doors(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """Per door: its counts, and its calls' outcomes."""
    found: dict[str, dict[str, Any]] = defaultdict(lambda: {"outcomes": Counter()})
    for name, count in ledger.counts.items():
        door, what = name.split("/", 1)
        found[door][what] = count
    for op in ledger.ops:
        outcomes = found[op.door]["outcomes"]
        if op.answers:
            outcomes[op.answers[0].outcome] += 1
        elif op.given_up:
            outcomes["no answer"] += 1
        else:
            outcomes["told why not"] += 1
            found[op.door].setdefault("told", Counter())[str(op.told)[:80]] += 1
    for figures in found.values():
        if "told" in figures:
            figures["told"] = dict(figures["told"].most_common(8))
    return {door: {**v, "outcomes": dict(v["outcomes"])} for door, v in sorted(found.items())}


def faults_by_kind(faults: list[Fault]) -> dict[str, dict[str, Any]]:
    """Per kind: how many were injected, recovered, failed to inject, and overlapped."""
    found: dict[str, dict[str, Any]] = {}
    for fault in faults:
        entry = found.setdefault(
            fault.kind.value, {"scheduled": 0, "injected": 0, "errors": 0, "overlapping": 0,
                               "seconds_to_recover": []},
        )  # fmt: skip
        entry["scheduled"] += 1
        if fault.started is None:
            continue
        entry["injected"] += 1
        entry["errors"] += bool(fault.error)
        entry["overlapping"] += bool(fault.overlapped)
        if fault.recovered is not None:
            entry["seconds_to_recover"].append(round(fault.recovered - fault.started, 1))
    return found


def as_json(
    header: dict[str, Any],
    *,
    ledger: Ledger,
    faults: list[Fault],
    violations: list[Violation],
    memory: list[RoleSlope],
    rows: RowWatch,
) -> dict[str, Any]:
    """The whole report."""
    return {
        **header,
        "operations": doors(ledger),
        "faults": [{**dataclasses.asdict(f), "kind": f.kind.value} for f in faults],
        "faults_by_kind": faults_by_kind(faults),
        "violations": [v.as_dict() for v in violations],
        "violations_by_invariant": dict(Counter(v.invariant for v in violations)),
        "memory": {
            "bound_kib_per_1000_calls": BOUND_KIB_PER_1000_CALLS,
            "roles": [{**dataclasses.asdict(m), "flat": m.flat} for m in memory],
        },
        "rows": {
            "at_end": rows.counts[-1][1] if rows.counts else None,
            "max": max((n for _, n in rows.counts), default=None),
            "bound_seconds": rows.bound,
            "retention_seconds": rows.retention,
            "failed_reads": rows.failed_reads,
        },
    }


def text(report: dict[str, Any]) -> list[str]:
    """The report as lines of text."""
    lines = [
        f"== soak: seed {report['seed']}, {report['minutes']} min of load, {report['date']}",
        f"   {report['command']}",
        f"   {report['stack']}",
        "== operations",
    ]
    for door, figures in report["operations"].items():
        counts = {k: v for k, v in figures.items() if k not in ("outcomes", "told")}
        lines.append(f"   {door:8} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        lines.append("            outcomes: " + ", ".join(
            f"{k} {v}" for k, v in sorted(figures["outcomes"].items())))  # fmt: skip
        for why, count in figures.get("told", {}).items():
            lines.append(f"            told {count}x: {why}")
    for session, notes in report.get("sessions", {}).items():
        lines.append(f"   session {session}:")
        lines += [f"      {note}" for note in notes]
    lines.append("== faults")
    for kind, entry in report["faults_by_kind"].items():
        recover = entry["seconds_to_recover"]
        lines.append(
            f"   {kind}: {entry['injected']}/{entry['scheduled']} injected,"
            f" {entry['overlapping']} overlapping, {entry['errors']} failed to inject,"
            f" back in {max(recover, default=0)} s at most"
        )
    aimed = {kind.value for kind in AIMED}
    for fault in report["faults"]:
        if fault["error"]:
            lines.append(
                f"   ! {fault['at']} s {fault['kind']} ({fault['target']}): {fault['error']}"
            )
        elif fault["kind"] in aimed and fault["started"] is not None:
            lines.append(f"   ~ {fault['started']} s {fault['kind']}: {fault['note']}")
    memory = report["memory"]
    bound = memory["bound_kib_per_1000_calls"]
    lines.append(
        f"== RSS, KiB per 1,000 calls (bound {bound:g}): each long-lived process's slope"
        " once warm, and the role's ceiling, last third against first"
    )
    for m in memory["roles"]:
        verdict = {True: "flat", False: "GROWING", None: "too short to judge"}[m["flat"]]
        ceiling = (
            "ceiling not compared (a short run)"
            if m.get("ceiling_first_kib") is None
            else f"ceiling {m['ceiling_first_kib'] // 1024} -> {m['ceiling_last_kib'] // 1024}"
            f" MiB ({m['ceiling_growth']})"
        )
        lines.append(
            f"   {m['role']:22} slope median {m['median']}, max {m['maximum']} over"
            f" {m['judged']}/{m['series']} processes; {ceiling};"
            f" last RSS {m['last_rss_kib'] // 1024} MiB: {verdict}"
        )
    rows = report["rows"]
    lines.append(
        f"== rows: {rows['at_end']} at the end, {rows['max']} at most; retention"
        f" {rows['retention_seconds']:g} s, none may stay past {rows['bound_seconds']:g} s"
    )
    if rows.get("heavy_busy_percent") is not None:
        lines.append(f"== heavy workers' slots busy {rows['heavy_busy_percent']:g}% of the run")
    for error in report.get("harness_errors", []):
        lines.append(f"== HARNESS ERROR: {error}")
    violations = report["violations"]
    lines.append(f"== violations: {len(violations)}")
    for invariant, count in sorted(report["violations_by_invariant"].items()):
        lines.append(f"   {invariant}: {count}")
    for violation in violations[:TIMELINES_SHOWN]:
        lines.append(f"-- {violation['invariant']}: {violation['detail']}")
        lines.append(f"   calls: {', '.join(violation['calls'])}")
        lines += [f"   {line}" for line in violation["timeline"]]
    if len(violations) > TIMELINES_SHOWN:
        lines.append(f"   ({len(violations) - TIMELINES_SHOWN} more in the JSON report)")
    return lines
