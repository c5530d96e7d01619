"""The abp-jobs command line on the real stack; Ctrl-C in a real pseudo-terminal (pexpect)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from django.utils import timezone
from PIL import Image

from capabilities.endings import cancellation
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.stack import Stack
from tests.support.tcp_relay import TcpRelay
from tests.support.waiting import eventually

CLI = [sys.executable, "-m", "abp_jobs_client"]


def environment(stack: Stack) -> dict[str, str]:
    return {**os.environ, "ABP_URL": stack.ws_url, "ABP_KEY": os.environ["ABP_TEST_AGENT_KEY"]}


def run(stack: Stack, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env=environment(stack),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def document(pages: int) -> str:
    """Pages of text, under the test stack's 1 MiB frame limit for 450 pages."""
    text = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 25 + "</p>"
    return f"<section style='page-break-after: always'>{text}</section>" * pages


def test_capabilities_prints_a_table_and_json(stack: Stack) -> None:
    table = run(stack, "capabilities")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["NAME", "AVAILABLE", "DESCRIPTION"]
    assert any(line.split()[:2] == ["export.pdf", "yes"] for line in table.stdout.splitlines())
    listed = json.loads(run(stack, "--json", "capabilities").stdout)
    assert {"export.pdf", "process.image", "convert.markdownToHtml"} <= {e["name"] for e in listed}


def test_a_call_writes_its_file_and_exits_0(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text("<h1>Report</h1>")
    done = run(
        stack, "call", "export.pdf", "--param", "html=@page.html", "-o", "out.pdf", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.pdf").read_bytes().startswith(b"%PDF")
    answer = json.loads(
        run(stack, "--json", "call", "convert.markdownToHtml", "--param", "markdown=# Hi").stdout
    )
    assert answer["status"] == "succeeded"
    assert "<h1" in answer["data"]["html"]


def test_an_image_goes_as_a_file_with_json_operations(stack: Stack, tmp_path: Path) -> None:
    photo = io.BytesIO()
    Image.effect_noise((1200, 900), 50).convert("RGB").save(photo, "JPEG")
    (tmp_path / "photo.jpg").write_bytes(photo.getvalue())
    operations = json.dumps([{"type": "resize", "width": 80, "height": 60}])
    done = run(
        stack,
        *("call", "process.image", "--param", "image=@photo.jpg"),
        *("--param", f"operations={operations}", "-o", "small.jpg"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "small.jpg") as small:
        assert small.size == (80, 60)


def test_failures_and_timeouts_exit_with_their_own_codes(stack: Stack) -> None:
    failed = run(stack, "--json", "call", "export.pdf", "--param", "html=5")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["error"]["details"]["path"].startswith("params.html")
    timed_out = run(
        stack,
        "call",
        "test.sleep",
        "--param",
        "steps=500",
        "--param",
        "stepMs=20",
        "--timeout",
        "0.3",
    )
    assert timed_out.returncode == 4, timed_out.stderr
    assert "timed out" in timed_out.stderr
    usage = run(stack, "call", "export.pdf", "--param", "html=@no-such-file.html")
    assert usage.returncode == 2


def test_ctrl_c_mid_pdf_cancels_with_confirmation_and_leaves_no_file(
    stack: Stack, tmp_path: Path
) -> None:
    (tmp_path / "long.html").write_text(document(450))
    started = timezone.now()
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "call", "export.pdf", "--param", "html=@long.html", "-o", "out.pdf"],
        env=environment(stack),
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=60,
    )
    try:
        mine = Job.objects.filter(capability="export.pdf", created_at__gte=started)
        try:
            job = eventually(mine.filter(status=JobStatus.RUNNING).first, timeout=30)
        except TimeoutError:
            raise AssertionError(child.read_nonblocking(100_000, timeout=1)) from None
        child.sendintr()
        child.expect(r"cancelled \(confirmed in [0-9.]+ ms\)")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 3
    stopped = eventually(Job.objects.filter(pk=job.pk, stopped_at__isnull=False).first)
    assert (stopped.status, stopped.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.html"]


def test_a_second_ctrl_c_leaves_at_once_when_the_confirmation_does_not_come(
    stack: Stack, tmp_path: Path
) -> None:
    relay = TcpRelay(stack.web_port)
    env = {**environment(stack), "ABP_URL": f"ws://127.0.0.1:{relay.port}/abp/ws"}
    started = timezone.now()
    args = ["call", "test.sleep", "--param", "steps=3000", "--param", "stepMs=20"]
    child = pexpect.spawn(CLI[0], [*CLI[1:], *args], env=env, cwd=str(tmp_path), timeout=30)
    try:
        mine = Job.objects.filter(capability="test.sleep", created_at__gte=started)
        job = eventually(mine.filter(status=JobStatus.RUNNING).first, timeout=30)
        relay.freeze()  # the server no longer hears, nor answers
        child.sendintr()
        child.expect("Ctrl-C again to quit now")
        child.sendintr()
        child.expect(pexpect.EOF, timeout=5)
    finally:
        child.close()
        relay.close()
    assert child.exitstatus == 130
    # Its session waits for a resume; an operator frees the worker for the next tests.
    cancellation.cancel(job.pk, source=CancelSource.OPERATOR, reason="test over")


def test_the_options_go_before_the_command_or_after_it() -> None:
    # `abp-jobs call X --json` is what people type; argparse alone refuses it.
    from abp_jobs_client import cli

    parse = cli._parser().parse_args
    assert parse(["call", "convert.markdownToHtml", "--json"]).json is True
    assert parse(["--json", "call", "convert.markdownToHtml"]).json is True
    assert parse(["capabilities"]).json is False
    given = parse(["--url", "ws://a/abp/ws", "capabilities", "--key", "k"])
    assert (given.url, given.key) == ("ws://a/abp/ws", "k")
    assert parse(["--url", "ws://a/abp/ws", "capabilities", "--url", "ws://b/abp/ws"]).url == (
        "ws://b/abp/ws"  # the last one given, as anywhere in argparse
    )


def test_an_error_is_told_in_plain_words() -> None:
    from abp_jobs_client.cli import explained
    from abp_jobs_client.errors import ABPError

    limited = ABPError.from_wire(
        {
            "code": "RATE_LIMITED",
            "message": "Too many calls.",
            "retryable": True,
            "retryAfter": 1500,
        }
    )
    assert explained("failed", limited) == (
        "failed: Too many calls. (RATE_LIMITED)\n  the server asks to try again in 1.5 s"
    )
    bad = ABPError.from_wire(
        {"code": "INVALID_PARAMS", "message": "Not a string.", "details": {"path": "params.html"}}
    )
    assert explained("failed", bad) == "failed: Not a string. (INVALID_PARAMS)\n  at params.html"
    lost = ABPError.from_wire({"code": "WORKER_LOST", "message": "Died.", "retryable": True})
    assert explained("failed", lost) == "failed: Died. (WORKER_LOST)\n  trying again may work"


@pytest.mark.stack  # the CLI in a process of its own
def test_help_shows_an_example_per_command() -> None:
    for command in ([], ["capabilities"], ["call"]):
        shown = subprocess.run(
            [*CLI, *command, "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        examples = shown.split("examples:\n", 1)[1]
        assert f"abp-jobs {command[0] if command else ''}".strip() in examples
