"""abp-jobs: capabilities and calls from the command line, on the asyncio client;
your jobs (the key owner's), listed and cancelled over HTTP.

Exit codes: 0 succeeded, 1 failed (or could not connect), 2 bad usage, 3 cancelled,
4 timed out, 130 a second Ctrl-C (left at once, without waiting).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from abp_jobs_client import cli_params, jobs_api
from abp_jobs_client.client import AsyncClient
from abp_jobs_client.errors import ABPError, CallCancelled, CallTimedOut
from abp_jobs_client.messages import Blob, Progress, Result

OK, FAILED, USAGE, CANCELLED, TIMED_OUT, INTERRUPTED = 0, 1, 2, 3, 4, 130
DEFAULT_URL = "ws://127.0.0.1:8000/abp/ws"

EXAMPLES = {
    "abp-jobs": """examples:
  abp-jobs capabilities
  abp-jobs call convert.markdownToHtml --param markdown='# Hello'
  abp-jobs --url wss://jobs.example.com/abp/ws --key "$KEY" call export.pdf \\
      --param html=@report.html -o report.pdf""",
    "capabilities": """examples:
  abp-jobs capabilities
  abp-jobs capabilities --json | jq -r '.[].name'""",
    "call": """examples:
  abp-jobs call export.pdf --param html=@report.html -o report.pdf
  abp-jobs call process.image --param image=@photo.jpg \\
      --param operations='[{"type": "resize", "width": 640}]' -o small.jpg
  abp-jobs call convert.markdownToHtml --param markdown=@README.md --json
  abp-jobs call export.pdf --param html=@big.html --timeout 30

A parameter is NAME=VALUE (a JSON value where the schema wants one), or NAME=@FILE
(text, or a file object for a binary parameter). Ctrl-C cancels the call and waits
for the server's confirmation; a second Ctrl-C quits at once.""",
    "jobs": """examples:
  abp-jobs jobs
  abp-jobs jobs --status active
  abp-jobs jobs --json | jq -r '.jobs[] | select(.active) | .id'

The jobs of the key's owner, from every door, newest first (as on /abp/jobs/).""",
    "cancel": """examples:
  abp-jobs cancel 0b5e7c3a-4f1d-4c55-9e2b-6d8f0a1b2c3d
  abp-jobs cancel 0b5e7c3a-4f1d-4c55-9e2b-6d8f0a1b2c3d --reason 'started by mistake'

Cancels one of the key owner's jobs, whichever door started it: its work stops, and
the agent that started it gets its call-result, cancelled by "user". Exits 0 once the
job is not running (cancelled now, or settled before), 1 if no job of yours has this
id or the key was refused.""",
}


def main(argv: list[str] | None = None) -> int:
    """Run the command line; its exit code."""
    args = _parser().parse_args(argv)
    try:
        code: int = asyncio.run(args.run(args))
    except ABPError as error:
        _report(args, {"status": "failed", "error": _error(error)}, explained("error", error))
        return FAILED
    except (OSError, cli_params.ParamError) as failed:
        print(f"error: {failed}", file=sys.stderr)
        return USAGE if isinstance(failed, cli_params.ParamError) else FAILED
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="abp-jobs",
        description=__doc__,
        epilog=EXAMPLES["abp-jobs"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_options(defaults=True)],
    )
    commands = parser.add_subparsers(required=True, metavar="command")
    # The options again after the command (`abp-jobs call X --json`), with no defaults
    # of their own there: the command's parser would otherwise undo those given before.
    after = _options(defaults=False)
    listing = commands.add_parser(
        "capabilities",
        help="list the capabilities",
        epilog=EXAMPLES["capabilities"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[after],
    )
    listing.set_defaults(run=_capabilities)
    call = commands.add_parser(
        "call",
        help="call a capability",
        epilog=EXAMPLES["call"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[after],
    )
    call.add_argument("capability")
    call.add_argument("--param", action="append", default=[], metavar="NAME=VALUE|NAME=@FILE")
    call.add_argument("-o", "--output", type=Path, help="write the result's file here")
    call.add_argument("--timeout", type=float, help="seconds (the server's default otherwise)")
    call.set_defaults(run=_call)
    jobs = commands.add_parser(
        "jobs",
        help="list your jobs (the key owner's), newest first",
        epilog=EXAMPLES["jobs"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[after],
    )
    jobs.add_argument(
        "--status", help="queued, running, succeeded, failed, cancelled, active, settled"
    )
    jobs.add_argument("--limit", type=int, help="at most this many (the server's page otherwise)")
    jobs.set_defaults(run=_jobs)
    cancel = commands.add_parser(
        "cancel",
        help="cancel one of your jobs",
        epilog=EXAMPLES["cancel"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[after],
    )
    cancel.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    cancel.add_argument("--reason", default="", help="kept on the job, for the admin")
    cancel.set_defaults(run=_cancel)
    return parser


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id (a UUID): {text!r}") from None


def _options(*, defaults: bool) -> argparse.ArgumentParser:
    """--url, --key and --json, taken before the command or after it."""
    options = argparse.ArgumentParser(add_help=False)

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    url = os.environ.get("ABP_URL", DEFAULT_URL)
    options.add_argument("--url", default=default(url), help="$ABP_URL")
    options.add_argument("--key", default=default(os.environ.get("ABP_KEY")), help="$ABP_KEY")
    options.add_argument(
        "--json", action="store_true", default=default(False), help="output a script can read"
    )
    return options


async def _capabilities(args: argparse.Namespace) -> int:
    async with AsyncClient(args.url, key=args.key) as client:
        listed = await client.capabilities()
    if args.json:
        print(json.dumps(listed, indent=2))
        return OK
    width = max((len(entry["name"]) for entry in listed), default=4)
    print(f"{'NAME':<{width}}  AVAILABLE  DESCRIPTION")
    for entry in listed:
        available = "yes" if entry.get("available", True) else "no"
        summary = str(entry.get("description", "")).split(". ")[0]
        print(f"{entry['name']:<{width}}  {available:<9}  {summary}")
    return OK


async def _call(args: argparse.Namespace) -> int:
    async with AsyncClient(args.url, key=args.key) as client:
        listed = {entry["name"]: entry for entry in await client.capabilities()}
        schema = (listed.get(args.capability) or {}).get("inputSchema") or {}
        params = cli_params.parse(args.param, schema)
        bar = _ProgressBar(enabled=not args.json and sys.stderr.isatty())
        handle = await client.start(
            args.capability, params, timeout=args.timeout, on_progress=bar.update
        )
        interrupted = asyncio.Event()
        _on_ctrl_c(interrupted)
        answer = asyncio.ensure_future(handle.result())
        stop = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait({answer, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not answer.done():
            confirmation = await handle.cancel("interrupted (Ctrl-C)")
            with contextlib.suppress(ABPError):
                await answer
            bar.stop()
            if confirmation.get("cancelled"):
                took = handle.confirmed_in_ms or 0.0
                line = f"cancelled (confirmed in {took:.1f} ms)"
                _report(args, {"status": "cancelled", "confirmedInMs": took}, line)
                return CANCELLED
        bar.stop()
        return _outcome(args, answer)


async def _jobs(args: argparse.Namespace) -> int:
    page = await asyncio.to_thread(
        jobs_api.list_jobs, args.url, args.key, status=args.status, limit=args.limit
    )
    if args.json:
        print(json.dumps(page, indent=2))
        return OK
    rows = [
        (job["id"], job["status"], job["capability"], job["door"], _progress(job), job["createdAt"])
        for job in page["jobs"]
    ]
    header = ("ID", "STATUS", "CAPABILITY", "DOOR", "PROGRESS", "CREATED")
    widths = [max(len(str(row[n])) for row in (header, *rows)) for n in range(len(header))]
    for row in (header, *rows):
        cells = (f"{cell!s:<{width}}" for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    if page.get("nextCursor"):
        print(f"(the newest {len(rows)}; --limit shows up to 100)", file=sys.stderr)
    return OK


def _progress(job: dict[str, Any]) -> str:
    done, total = job.get("progress"), job.get("progressTotal")
    shown = f"{done:g}/{total:g}" if done is not None and total else ""
    return f"{shown} {job.get('stage') or ''}".strip() or "-"


async def _cancel(args: argparse.Namespace) -> int:
    answer = await asyncio.to_thread(
        jobs_api.cancel_job, args.url, args.key, args.job_id, args.reason
    )
    if args.json:
        print(json.dumps(answer))
    elif answer["cancelled"]:
        print(f"cancelled {answer['id']}")
    else:
        print(f"{answer['id']} had already settled ({answer['status']}): nothing to cancel")
    return OK


def _outcome(args: argparse.Namespace, answer: asyncio.Future[Result]) -> int:
    try:
        result = answer.result()
    except CallCancelled as error:
        _report(
            args, {"status": "cancelled", "error": _error(error)}, explained("cancelled", error)
        )
        return CANCELLED
    except CallTimedOut as error:
        _report(args, {"status": "timedOut", "error": _error(error)}, explained("timed out", error))
        return TIMED_OUT
    except ABPError as error:
        _report(args, {"status": "failed", "error": _error(error)}, explained("failed", error))
        return FAILED
    saved = _save(result.data, args.output) if args.output else None
    shown = {
        "status": "succeeded",
        "callId": result.call_id,
        "durationMs": result.duration_ms,
        "data": _printable(result.data),
    }
    if saved is not None:
        shown["savedTo"] = str(saved)
    text = f"saved {saved}" if saved else json.dumps(_printable(result.data), indent=2)
    _report(args, shown, text)
    return OK


def _save(data: dict[str, Any], output: Path) -> Path:
    """The first file in the result, written whole or not at all."""
    blob = next(iter(_blobs(data)), None)
    if blob is None:
        raise OSError("the result holds no file to write")
    with tempfile.NamedTemporaryFile(dir=output.parent, delete=False) as partial:
        partial.write(blob.content)
    os.replace(partial.name, output)
    return output


def _blobs(value: Any) -> list[Blob]:
    if isinstance(value, Blob):
        return [value]
    if isinstance(value, dict):
        return [blob for item in value.values() for blob in _blobs(item)]
    if isinstance(value, list):
        return [blob for item in value for blob in _blobs(item)]
    return []


def _printable(value: Any) -> Any:
    if isinstance(value, Blob):
        return {"mimeType": value.mime_type, "size": len(value.content), "filename": value.filename}
    if isinstance(value, dict):
        return {key: _printable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_printable(item) for item in value]
    return value


def _on_ctrl_c(interrupted: asyncio.Event) -> None:
    """The first Ctrl-C cancels the call; a second one leaves at once."""

    def pressed() -> None:
        if interrupted.is_set():
            os._exit(INTERRUPTED)
        interrupted.set()
        print("\ncancelling... (Ctrl-C again to quit now)", file=sys.stderr)

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, pressed)


def _report(args: argparse.Namespace, shown: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(shown))
    else:
        print(text, file=sys.stdout if shown["status"] == "succeeded" else sys.stderr)


def explained(outcome: str, error: ABPError) -> str:
    """The error in plain words: what happened, where, and whether to try again."""
    lines = [f"{outcome}: {error.message} ({error.code})"]
    where = error.details.get("path")
    if where:
        lines.append(f"  at {where}")
    if error.retry_after_ms is not None:
        lines.append(f"  the server asks to try again in {error.retry_after_ms / 1000:g} s")
    elif error.retryable:
        lines.append("  trying again may work")
    return "\n".join(lines)


def _error(error: ABPError) -> dict[str, Any]:
    shown: dict[str, Any] = {"code": error.code, "message": error.message}
    shown["retryable"] = error.retryable
    if error.retry_after_ms is not None:
        shown["retryAfter"] = error.retry_after_ms
    if error.details:
        shown["details"] = error.details
    return shown


class _ProgressBar:
    """A live bar on stderr with the call's stage (rich, when installed and a terminal)."""

    def __init__(self, *, enabled: bool) -> None:
        self._bar: Any = None
        self._task: Any = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
        except ImportError:
            return
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            transient=True,
            console=Console(stderr=True),
        )
        self._bar.start()
        self._task = self._bar.add_task("queued", total=None)

    def update(self, progress: Progress) -> None:
        if self._bar is None:
            return
        stage = progress.stage or "running"
        if progress.position is not None:
            stage = f"queued (#{progress.position})"
        total = progress.total if progress.total else None
        self._bar.update(self._task, description=stage, completed=progress.progress, total=total)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
