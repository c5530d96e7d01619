"""Issue 17's figures side by side, each against its baseline, measured in one run.

One stack (Redis, the Celery workers, beat, Daphne) plus a bare Celery worker, one
client (this process), and, in turn:
- a small call (convert.markdownToHtml over /abp/ws) against bare Celery
  `apply_async().get()`, interleaved call by call, and (in alternating rounds, so
  each side's processes are metered alone) the CPU per call of each side
  (user + sys of every process of that side, this client included, via psutil);
- cancel -> cancel-result of a running test.sleep, and of a call the cancel is sent
  right behind, against a frame the consumer answers without the DB, idle;
- process.image of a 12 MP JPEG to 800x600 through the stack against the best
  in-process Pillow recipe and against naive `Image.open().resize()`;
- export.pdf of 50 pages through the stack against WeasyPrint in-process.
Prints a Markdown table (metric | ours | baseline | ratio), ready for the README.

Run: .venv/bin/python bench/side_by_side.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

# Results come back inline (no download URL), as the in-process recipes return bytes.
STACK = environment.prepare("abp-bench-sbs-", ABP_INLINE_RESULT_MAX_BYTES=str(64 * 1024 * 1024))

import psutil  # type: ignore[import-untyped]  # noqa: E402

from bench import stats  # noqa: E402
from bench.common import (  # noqa: E402
    bare_celery_calls,
    bare_worker,
    best_resize,
    consumer_frame,
    document,
    naive_resize,
    photo,
    render_locally,
    through_stack,
    timed,
)
from capabilities.models import Job, JobStatus  # noqa: E402
from tests.support.agent import Agent  # noqa: E402
from tests.support.stack import ROOT  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

MARKDOWN = "# Notes\n\nA *short* document with a [link](https://example.com).\n\n- one\n- two\n"
SLEEP = {"steps": 1000, "stepMs": 5}  # 5 s of work with a checkpoint every 5 ms


class CpuMeter:
    """User + sys CPU seconds used so far by some processes (with their children) and us."""

    def __init__(self, pids: list[int]) -> None:
        self.roots = [psutil.Process(pid) for pid in pids]
        self.me = psutil.Process()

    def seconds(self) -> float:
        mine = self.me.cpu_times()
        total = float(mine.user + mine.system)
        for root in self.roots:
            # A prefork child that exits moves its time into the parent's children_*.
            for process in (root, *root.children(recursive=True)):
                try:
                    t = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += t.user + t.system + t.children_user + t.children_system
        return total


def small_calls(agent: Agent, n: int) -> list[float]:
    """n convert.markdownToHtml round trips, in ms."""
    params = {"markdown": MARKDOWN}
    times = [
        timed(partial(through_stack, agent, "convert.markdownToHtml", params)) for _ in range(n)
    ]
    agent.inbox.clear()
    return times


def small_call_rounds(
    agent: Agent, rounds: int, calls: int, meters: dict[str, CpuMeter]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Both sides in alternating rounds: their times (ms) and CPU per call (ms)."""
    runs: dict[str, Callable[[], list[float]]] = {
        "ours": partial(small_calls, agent, calls),
        "bare": partial(bare_celery_calls, calls),
    }
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    cpu = {"ours": 0.0, "bare": 0.0}
    for r in range(rounds):
        for side in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
            before = meters[side].seconds()
            times[side] += runs[side]()
            cpu[side] += meters[side].seconds() - before
    return times, {side: cpu[side] * 1000 / len(times[side]) for side in cpu}


def interleaved_small_calls(agent: Agent, n: int) -> dict[str, list[float]]:
    """n round trips of each side, call by call, each pair in turn first: times (ms)."""
    params = {"markdown": MARKDOWN}
    ours = partial(through_stack, agent, "convert.markdownToHtml", params)
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    for i in range(n):
        for side in ("ours", "bare") if i % 2 == 0 else ("bare", "ours"):
            times[side] += [timed(ours)] if side == "ours" else bare_celery_calls(1)
    agent.inbox.clear()
    return times


def cancel_ms(agent: Agent, call: str, call_id: str) -> float:
    """Cancel `call_id`: ms from the cancel sent to its cancel-result; waits for the call."""
    start = time.perf_counter()
    agent.reply_to(agent.cancel(call_id), "capabilities/cancel-result")
    elapsed = (time.perf_counter() - start) * 1000
    result = agent.result_of(call)
    assert result["payload"].get("cancelled") is True, result
    return elapsed


def cancel_rounds(agent: Agent, rounds: int, rng: random.Random) -> dict[str, list[float]]:
    """Per round: an idle consumer frame, a cancel of a running call, a cancel right behind."""
    times: dict[str, list[float]] = {"idle": [], "running": [], "behind": []}
    for i in range(rounds):
        time.sleep(0.02)  # the last round's calls have stopped: the stack is idle
        times["idle"].append(timed(partial(consumer_frame, agent)))
        call_id = f"running-{i}"
        call = agent.call("test.sleep", SLEEP, call_id=call_id)
        job = Job.objects.filter(session_id=agent.session_id, call_id=call_id)
        eventually(job.filter(status=JobStatus.RUNNING).exists, interval=0.002)
        time.sleep(rng.uniform(0, 0.05))
        times["running"].append(cancel_ms(agent, call, call_id))
        call_id = f"behind-{i}"
        time.sleep(0.02)  # as before the idle frame: the cancelled call's worker has stopped
        times["behind"].append(
            cancel_ms(agent, agent.call("test.sleep", SLEEP, call_id=call_id), call_id)
        )
        agent.inbox.clear()
    return times


def image_through_stack(agent: Agent, jpeg: bytes) -> None:
    """process.image of the JPEG to 800x600 through the stack: uploaded, then named.

    The bytes go raw to `POST /abp/uploads` (a new HTTP connection, as a client
    that only uploads now and then opens one), and the call passes the reference.
    """
    connection = http.client.HTTPConnection("127.0.0.1", STACK.web_port, timeout=60)
    try:
        headers = {
            "Authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}",
            "ABP-Session": str(agent.session_id),
            "Content-Type": "image/jpeg",
        }
        connection.request("POST", "/abp/uploads", body=jpeg, headers=headers)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    assert response.status == 201, answer
    operations = [{"type": "resize", "width": 800, "height": 600, "fit": "fill"}]
    params = {"image": json.loads(answer), "operations": operations, "format": "jpeg"}
    through_stack(agent, "process.image", params)


def alternating(rounds: int, agent: Agent, **work: Callable[[], object]) -> dict[str, list[float]]:
    """Each piece of work once as a warm-up, then once per round, in turn."""
    for run in work.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        for name, run in work.items():
            times[name].append(timed(run))
        agent.inbox.clear()
    return times


def revision() -> str:
    """HEAD, short, and whether the tree differs from it (read-only git commands)."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)

    head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    return head + (
        " + uncommitted changes" if git("diff", "--quiet", "HEAD", "--").returncode else ""
    )


def machine() -> str:
    """The CPU model and the number of cores."""
    cpuinfo = Path("/proc/cpuinfo")
    models = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    return f"{models[0] if models else platform.machine()}, {os.cpu_count()} cores"


Row = tuple[str, str, str, str]


def compare(metric: str, ours: list[float], baseline: list[float], note: str = "") -> Row:
    """A row of the table: metric, our p50/p99, the baseline's, the ratio of the p50s."""
    ratio = stats.ratio(ours, baseline)
    return metric, stats.cell(ours), stats.cell(baseline), f"{ratio:.2f}x{note}"


def report(rows: list[Row], quick: bool) -> str:
    """The table in Markdown, under the date, the machine, the revision and the command."""
    now = datetime.datetime.now(datetime.UTC)
    command = f"{os.path.relpath(sys.executable, ROOT)} bench/side_by_side.py"
    lines = [
        f"{now:%Y-%m-%d %H:%M} UTC; {machine()}; revision {revision()}; SQLite.",
        f"Command: `{command}{' --quick' if quick else ''}`",
        "",
        "| metric | ours | baseline | ratio (p50) |",
        "|---|---|---|---|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about a third)")
    args = parser.parse_args()
    rounds, calls, cancels, images, pdfs = (
        (6, 20, 20, 5, 3) if args.quick else (20, 50, 100, 20, 10)
    )
    jpeg, html = photo(), document(50)
    bare = bare_worker(STACK.run_dir)
    try:
        STACK.start()
        bare.start(lambda: " ready." in bare.log_text())
        stack_pids = [p.pid for p in (STACK.web, STACK.worker, STACK.small_worker, STACK.beat)]
        meters = {
            "ours": CpuMeter([*stack_pids, STACK.redis.pid]),
            "bare": CpuMeter([bare.pid, STACK.redis.pid]),
        }
        with Agent(STACK.ws_url) as agent:
            agent.initialize()
            small_calls(agent, 20)  # warm up the workers and the connections
            bare_celery_calls(20)
            _, cpu = small_call_rounds(agent, rounds, calls, meters)
            small = interleaved_small_calls(agent, rounds * calls)
            cancel = cancel_rounds(agent, cancels, random.Random(1))
            image = alternating(
                images,
                agent,
                stack=partial(image_through_stack, agent, jpeg),
                best=partial(best_resize, jpeg),
                naive=partial(naive_resize, jpeg),
            )
            pdf = alternating(
                pdfs,
                agent,
                stack=partial(through_stack, agent, "export.pdf", {"html": html}),
                local=partial(render_locally, html),
            )
    finally:
        bare.stop()
        STACK.stop()
        STACK.remove_files()

    added = stats.summary(cancel["behind"])["p50"] - stats.summary(cancel["idle"])["p50"]
    rows = [
        compare(
            "small call: `convert.markdownToHtml` over `/abp/ws` / bare Celery "
            f"`apply_async().get()` ({rounds * calls} of each, interleaved call by call; "
            "goal <= 1.0x)",
            small["ours"],
            small["bare"],
        ),
        (
            "CPU per small call, user + sys: Daphne, the Celery workers and beat / the bare "
            "worker; Redis and the client on both sides",
            f"{cpu['ours']:.2f} ms",
            f"{cpu['bare']:.2f} ms",
            f"{cpu['ours'] / cpu['bare']:.2f}x",
        ),
        compare(
            "cancel -> cancel-result, running `test.sleep` / a frame the consumer answers "
            f"without the DB, idle ({cancels} of each)",
            cancel["running"],
            cancel["idle"],
        ),
        compare(
            "cancel sent right behind its call -> cancel-result / the same idle frame "
            "(goal: < 1 ms added)",
            cancel["behind"],
            cancel["idle"],
            f" (+{added:.2f} ms)",
        ),
        compare(
            f"`process.image`, 12 MP JPEG ({len(jpeg) / 1e6:.1f} MB, uploaded raw to "
            "`/abp/uploads` then named by reference, the upload included) -> "
            f"800x600 / best in-process Pillow recipe ({images} rounds; goal <= 1.2x)",
            image["stack"],
            image["best"],
        ),
        compare(
            "the same / naive `Image.open().resize()` in-process (goal <= 0.5x)",
            image["stack"],
            image["naive"],
        ),
        compare(
            f"`export.pdf` of 50 pages / WeasyPrint `write_pdf()` in-process ({pdfs} rounds; "
            "goal <= 1.05x)",
            pdf["stack"],
            pdf["local"],
        ),
    ]
    print("\n## Side by side (issue 17)\n")
    print(report(rows, args.quick))


if __name__ == "__main__":
    main()
