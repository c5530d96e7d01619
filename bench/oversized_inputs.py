"""What an input over its size limit costs before it is refused, through the whole stack.

For each oversized input (Markdown, HTML, a base64 image), sends one call and prints:
the answer's code, what was stored for it (the job row's params and any spilled
file, in bytes), and how much the worker processes' peak resident memory grew.

Run it on a checkout to compare (the same script in both):
    .venv/bin/python bench/oversized_inputs.py [--megabytes 15.7]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

# Frames large enough to carry the inputs: the frame limit is not what is measured.
STACK = environment.prepare("abp-bench-oversized-", ABP_MAX_FRAME_BYTES=str(64 * 1024 * 1024))


from capabilities.conf import abp_settings  # noqa: E402
from capabilities.models import Job  # noqa: E402
from tests.support.agent import Agent  # noqa: E402


def worker_processes() -> list[int]:
    """The worker's main process and its pool children."""
    children = Path(f"/proc/{STACK.worker.pid}/task/{STACK.worker.pid}/children")
    return [STACK.worker.pid, *(int(pid) for pid in children.read_text().split())]


def peak_kib(pid: int) -> int:
    """A process's peak resident memory (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def stored_bytes(job: Job | None) -> int:
    """What was written for the call: the row's params, and inputs spilled to storage."""
    if job is None:
        return 0
    spilled = getattr(job, "spilled", None) or {}  # older code kept the length in params
    lengths = [entry["length"] for entry in spilled.values()] + [
        value["length"]
        for value in job.params.values()
        if isinstance(value, dict) and "length" in value
    ]
    return len(json.dumps(job.params)) + int(sum(lengths))


def measure(label: str, capability: str, params: dict[str, object]) -> None:
    before = {pid: peak_kib(pid) for pid in worker_processes()}
    with Agent(STACK.ws_url) as agent:
        agent.initialize()
        start = time.perf_counter()
        response = agent.result_of(agent.call(capability, params, call_id="big"), timeout=120)
        elapsed = (time.perf_counter() - start) * 1000
        # Stored before the worker saw it, and (old code) deleted once it was done.
        job = Job.objects.filter(session_id=agent.session_id, call_id="big").first()
    after = {pid: peak_kib(pid) for pid in worker_processes()}
    growth = max((after[pid] - before.get(pid, after[pid])) for pid in after) / 1024
    error = response["payload"].get("error") or {}
    print(
        f"{label:<34} answer={error.get('code', 'success'):<16} in {elapsed:8.1f} ms  "
        f"row={'yes' if job else 'no ':<3}  params stored={stored_bytes(job) / 1e6:6.2f} MB  "
        f"worker peak RSS +{growth:6.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=float, default=15.7)
    size = int(parser.parse_args().megabytes * 1_000_000)
    STACK.start()
    try:
        abp = abp_settings()
        print(
            f"limits: markdown {abp.MAX_MARKDOWN_BYTES} B, html {abp.MAX_HTML_BYTES} B, "
            f"image {abp.MAX_IMAGE_BYTES} B (decoded); text inputs of {size / 1e6:.1f} MB"
        )
        measure("Markdown over its limit", "convert.markdownToHtml", {"markdown": "x" * size})
        measure("HTML over its limit", "export.pdf", {"html": "<p>x</p>" * (size // 8)})
        # Base64 of 10% more bytes than the image limit.
        image = {"content": "QUJD" * int(abp.MAX_IMAGE_BYTES * 1.1 / 3), "encoding": "base64"}
        measure("base64 image over its limit", "process.image", {"image": image})
    finally:
        STACK.stop()
        STACK.remove_files()


if __name__ == "__main__":
    main()
