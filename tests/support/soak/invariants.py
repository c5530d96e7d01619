"""What must hold, checked on the ledger (every call on every door) and the rows.

- every call is answered exactly once, or its client was told why it cannot be;
- an answer is the call's own (its result names it: no answer goes to another session),
  and agrees with the call's job row;
- a cancelled answer comes after a cancel, a timeout, or a revoked key; one the server
  gave after the client's cancel has a job row, cancelled, even when the cancel won
  the call's start (the row is then written already settled);
- a session resumes within its grace: only a revoked key's resume is refused;
- no progress for a call arrives after its answer (no work runs for a settled job);
- calls make progress: no heavy call reaches its deadline, 30 s past its own run, unless
  its timeout was set shorter than its run on purpose;
- and the rows' own findings (rows.py): lost, duplicated, past a deadline, work after
  a settle, kept past retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.support.soak.ledger import Op
from tests.support.soak.plan import HEAVY_SLACK_SECONDS
from tests.support.soak.rows import JobHistory, RowWatch

# Progress may be on its way when the answer overtakes it; later than this, work ran.
LATE_PROGRESS_SECONDS = 2.0
# Errors an answer may carry under faults: the call's own fate, said with a code.
FAULT_CODES = {"WORKER_LOST", "CAPABILITY_UNAVAILABLE", "DISCONNECTED", "RATE_LIMITED"}
ROW_STATUS = {"succeeded": "succeeded", "cancelled": "cancelled", "timeout": "cancelled"}
# Doors whose answers are the server's own frames. The browser's client.js, the Python
# client and the MCP SDK may settle a call cancelled on their side, before the server
# had it: no row then.
SERVER_ANSWERED = {"abp", "rpc"}


@dataclass
class Violation:
    """One broken invariant, with the calls it concerns and their timelines."""

    invariant: str
    detail: str
    tags: list[str]
    timeline: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report."""
        return {"invariant": self.invariant, "detail": self.detail, "calls": self.tags,
                "timeline": self.timeline}  # fmt: skip


def timeline(op: Op | None, jobs: list[JobHistory]) -> list[str]:
    """A call's frames and its job rows' status changes, in time order."""
    lines: list[tuple[float, str]] = []
    if op is not None:
        lines += [(at, f"{op.door} {op.tag}: {text}") for at, text in op.timeline]
    for job in jobs:
        row = job.row
        lines += [(at, f"row {row['id'][:8]} {status}") for at, status in job.changes]
        if job.gone_at is not None:
            lines.append((job.gone_at, f"row {row['id'][:8]} gone"))
        stamps = {k: row[k] for k in ("created_at", "started_at", "settled_at", "stopped_at")}
        lines.append(
            (
                lines[-1][0] if lines else 0.0,
                f"row {row['id'][:8]} at the end: "
                f"{row['status']} {row['error_code']} {row['cancel_source']} "
                f"worker={row['worker']} " + " ".join(f"{k}={v}" for k, v in stamps.items()),
            )
        )
    return [f"{at:9.3f}  {text}" for at, text in sorted(lines, key=lambda line: line[0])]


def check_op(op: Op, rows: RowWatch, revoked: set[str]) -> list[Violation]:
    """What is wrong with one call."""
    jobs = rows.rows_of(op.tag)
    found: list[str] = []
    answers = op.answers
    if not answers:
        if op.given_up or op.told is None:
            found.append("no answer" + (", and the client was not told why" if not op.told else ""))
    elif len(answers) > 1:
        found.append(f"answered {len(answers)} times: {[a.outcome for a in answers]}")
    for answer in answers:
        if not answer.data_ok:
            found.append(f"the answer names another call: {answer.detail}")
    if answers:
        answer = answers[0]
        cancel_like = answer.outcome in ("cancelled", "timeout")
        client_side = answer.detail.get("client") is not None
        if answer.outcome == "cancelled" and op.cancelled_at is None and op.session not in revoked:
            found.append(f"cancelled, but no cancel was sent: {answer.detail}")
        if answer.outcome.startswith("error:"):
            code = answer.outcome.split(":", 1)[1]
            error = answer.detail.get("error") or {}
            retryable = isinstance(error, dict) and error.get("retryable") is True
            if code not in FAULT_CODES and not retryable:
                found.append(f"failed with {code}: {answer.detail}")
        if not client_side and jobs:
            status = jobs[-1].row["status"]
            want = ROW_STATUS.get(answer.outcome, "failed")
            if status != want:
                found.append(f"answered {answer.outcome}, but its job is {status}")
        if not client_side and not jobs and not cancel_like and answer.outcome == "succeeded":
            found.append("answered succeeded, but no job row was ever seen")
        if (
            answer.outcome == "cancelled" and op.cancelled_at is not None and not jobs
            and op.door in SERVER_ANSWERED
        ):  # fmt: skip
            found.append("answered cancelled after its cancel, but no job row was ever seen")
        timeout_ms = op.timeout_ms or 0
        if answer.outcome == "timeout" and timeout_ms >= HEAVY_SLACK_SECONDS * 1000:
            found.append(f"starved: timed out {timeout_ms / 1000:g} s after it was sent")
        late = [at for at in op.late_progress if at - answer.at > LATE_PROGRESS_SECONDS]
        if late:
            found.append(f"progress {late[-1] - answer.at:.1f} s after its answer")
    return [Violation(_name(text), text, [op.tag], timeline(op, jobs)) for text in found]


def _name(text: str) -> str:
    if text.startswith("no answer") or (text.startswith("answered ") and "times" in text):
        return "answered exactly once"
    if "another call" in text:
        return "no answer goes to another session"
    if text.startswith("progress"):
        return "no work runs for a settled job"
    if text.startswith("starved"):
        return "calls make progress"
    if "cancelled after its cancel" in text:
        return "a cancelled call's row is written settled"
    return "answers agree with their job"


def check(
    ops: list[Op],
    rows: RowWatch,
    *,
    revoked: set[str],
    strays: list[str],
    refused: dict[str, str] | None = None,
) -> list[Violation]:
    """Every violation of the run; `strays` are frames that answered no call of theirs,
    `refused` the sessions whose resume was refused (session id: what they were told)."""
    violations = [v for op in ops for v in check_op(op, rows, revoked)]
    for session, told in (refused or {}).items():
        if session in revoked:
            continue
        lost = [op for op in ops if op.session == session and op.told is not None]
        lines = [line for op in lost for line in timeline(op, rows.rows_of(op.tag))]
        detail = f"session {session}: {told}"[:300]
        violations.append(
            Violation("a resume within its grace succeeds", detail, [op.tag for op in lost], lines)
        )
    by_tag = {op.tag: op for op in ops}
    for finding in rows.findings:
        op = by_tag.get(finding.tag)
        jobs = rows.rows_of(finding.tag)
        invariant = {
            "lost": "no job row is lost or duplicated",
            "duplicated": "no job row is lost or duplicated",
            "past its deadline": "no job is non-terminal past its deadline plus the grace",
            "work after its settle": "no work runs for a settled job",
            "kept past retention": "rows stay bounded by retention",
        }[finding.kind]
        detail = f"job {finding.job_id}: {finding.kind}: {finding.detail} (seen at {finding.at} s)"
        violations.append(Violation(invariant, detail, [finding.tag], timeline(op, jobs)))
    for stray in strays:
        violations.append(Violation("no answer goes to another session", stray, []))
    return violations
