"""The product's capabilities over the real stack, and their discovery."""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import default_storage
from PIL import Image

from capabilities.models import Job
from capabilities.work import registry
from tests.support.agent import Agent
from tests.support.jobs import wait_running, wait_stopped_by_cancel
from tests.support.stack import Stack
from tests.support.waiting import eventually


def binary(data: bytes, mime: str) -> dict[str, str]:
    return {"content": base64.b64encode(data).decode(), "mimeType": mime, "encoding": "base64"}


def rotated_jpeg() -> bytes:
    """A 60x40 landscape JPEG whose EXIF says: rotate 90 degrees clockwise to view."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.new("RGB", (60, 40), (200, 30, 30)).save(buffer, "JPEG", exif=exif)
    return buffer.getvalue()


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A valid PNG header announcing a huge image, with a few bytes of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    pixels = zlib.compress(b"\x00" * 1000)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def call(agent: Agent, capability: str, params: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = agent.result_of(agent.call(capability, params), timeout=30)["payload"]
    return payload


def test_process_image_applies_exif_then_operations(agent: Agent) -> None:
    payload = call(
        agent,
        "process.image",
        {
            "image": binary(rotated_jpeg(), "image/jpeg"),
            "operations": [{"type": "grayscale"}, {"type": "convert", "format": "png"}],
        },
    )
    assert payload["success"] is True, payload
    data = payload["data"]
    assert (data["width"], data["height"]) == (40, 60)  # portrait once the EXIF is applied
    image_data = data["image"]
    assert image_data["mimeType"] == "image/png"
    decoded = Image.open(io.BytesIO(base64.b64decode(image_data["content"])))
    assert decoded.format == "PNG"
    assert decoded.size == (40, 60)
    assert decoded.mode == "L"


@pytest.mark.parametrize(
    ("params", "code", "path"),
    [
        ({"image": binary(bomb_png(), "image/png"), "operations": []}, "INVALID_PARAMS",
         "params.image.content"),
        ({"image": binary(rotated_jpeg(), "image/jpeg"),
          "operations": [{"type": "resize", "width": 50000}]}, "INVALID_PARAMS",
         "params.operations[0].width"),
        ({"image": binary(b"BM" + b"\x00" * 100, "image/bmp"), "operations": []},
         "INVALID_PARAMS", "params.image.content"),
        ({"image": {"content": "not base64 at all!", "encoding": "base64"}, "operations": []},
         "INVALID_PARAMS", "params.image.content"),
    ],
)  # fmt: skip
def test_process_image_refusals(agent: Agent, params: dict[str, Any], code: str, path: str) -> None:
    payload = call(agent, "process.image", params)
    assert payload["success"] is False
    assert payload["error"]["code"] == code
    assert payload["error"]["details"]["path"] == path


def test_cancel_a_running_image_job(agent: Agent, stack: Stack) -> None:
    buffer = io.BytesIO()
    # Smooth, so it stays small on the wire (the tests' frame limit is 1 MiB).
    Image.linear_gradient("L").resize((3000, 2000)).convert("RGB").save(buffer, "JPEG")
    heavy = {
        "image": binary(buffer.getvalue(), "image/jpeg"),
        "operations": [{"type": "blur", "radius": 60}] * 6,
    }
    call_id = agent.call("process.image", heavy, call_id="img-cancel")
    wait_running(agent, "img-cancel")
    agent.cancel("img-cancel")
    assert agent.result_of(call_id)["payload"]["cancelled"] is True
    job = wait_stopped_by_cancel(stack, agent, "img-cancel")
    assert not job.hard_killed


def test_large_inputs_stay_out_of_the_job_row(agent: Agent) -> None:
    buffer = io.BytesIO()
    Image.effect_noise((400, 400), 60).convert("RGB").save(buffer, "JPEG", quality=95)
    assert len(buffer.getvalue()) * 4 / 3 > 64 * 1024
    params: dict[str, Any] = {"image": binary(buffer.getvalue(), "image/jpeg"), "operations": []}
    call_id = agent.call("process.image", params, call_id="spilled")
    assert agent.result_of(call_id)["payload"]["data"]["width"] == 400
    job = Job.objects.get(session_id=agent.session_id, call_id="spilled")
    assert job.params["image"]["content"] is None
    spilled = job.spilled["image"]
    assert spilled["length"] == len(params["image"]["content"])
    # The worker removed it once the work was over.
    assert not default_storage.exists(spilled["name"])


def test_markdown_to_sanitized_html(agent: Agent) -> None:
    payload = call(
        agent,
        "convert.markdownToHtml",
        {"markdown": "# Title\n\n*hi* <script>alert(1)</script> [x](javascript:alert(1))"},
    )
    html = payload["data"]["html"]
    assert "<h1>Title</h1>" in html
    assert "<em>hi</em>" in html
    assert "<script" not in html
    assert "javascript:" not in html


def test_manifest_and_initialize_come_from_one_registry(stack: Stack, agent: Agent) -> None:
    with urllib.request.urlopen(stack.http_url + "/abp.json", timeout=10) as response:
        manifest = json.load(response)
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert "max-age=" in response.headers["Cache-Control"]
    names = [c["name"] for c in manifest["capabilities"]]
    assert names[:3] == ["export.pdf", "process.image", "convert.markdownToHtml"]
    for capability in manifest["capabilities"]:
        assert capability["inputSchema"]["type"] == "object"
        assert capability["outputSchema"]["type"] == "object"
    again = agent.send("initialize", {})
    assert agent.reply_to(again, "initialize-result")["payload"]["error"]["code"] == (
        "ALREADY_INITIALIZED"
    )
    with Agent(stack.ws_url) as other:
        offered = [c["name"] for c in other.initialize()["payload"]["capabilities"]]
    # The public manifest lists what needs no user's permission, and says sign-in shows
    # more; a session lists what it may call: for the suite's service key, the same.
    guarded = {spec.name for spec in registry.all_specs() if spec.permissions}
    assert guarded
    assert not guarded & set(names)
    assert manifest["signIn"]["url"] == "/accounts/login/"
    assert offered == names
    with urllib.request.urlopen(stack.http_url + "/", timeout=10) as page:
        assert '<link rel="abp-manifest" href="/abp.json">' in page.read().decode()


def test_a_declared_capability_is_served_with_its_generated_schemas(
    stack: Stack, agent: Agent
) -> None:
    # tests/reports/abp_capabilities.py: the tutorial's example, found by autodiscovery.
    with urllib.request.urlopen(stack.http_url + "/abp.json", timeout=10) as response:
        manifest = json.load(response)
    by_name = {c["name"]: c for c in manifest["capabilities"]}
    squares = by_name["reports.squares"]
    assert squares == {**registry.require("reports.squares").describe(), "available": True}
    inputs = squares["inputSchema"]["properties"]
    assert (inputs["rows"]["type"], inputs["title"]["type"]) == ("integer", "string")
    assert set(squares["outputSchema"]["required"]) == {"rows", "csv"}
    refused = call(agent, "reports.squares", {"rows": "many"})
    assert refused["error"]["code"] == "INVALID_TYPE"
    payload = call(agent, "reports.squares", {"rows": 3})
    assert payload["success"] is True, payload
    csv = payload["data"]["csv"]
    assert (payload["data"]["rows"], csv["mimeType"], csv["filename"]) == (
        3,
        "text/csv",
        "squares.csv",
    )
    assert base64.b64decode(csv["content"]) == b"# Squares\nn,square\n0,0\n1,1\n2,4"


@pytest.mark.parametrize(
    ("capability", "params"),
    [
        # The tutorial's: 5 ms a row, far longer than the test unless the cancel stops it.
        ("reports.squares", {"rows": 1_000_000}),
        # tests/testapp: an `async def`, 5 ms an await; a cancel cancels its task.
        ("test.asyncTicks", {"ticks": 1_000_000, "tick_ms": 5}),
    ],
)
def test_a_declared_capability_reports_progress_and_stops_on_cancel(
    stack: Stack, agent: Agent, capability: str, params: dict[str, Any]
) -> None:
    token = f"progress-{capability}"
    call_id = agent.call(capability, params, call_id=capability, progress_token=token)
    progress = agent.wait_for(
        lambda e: e["type"] == "progress" and e["payload"]["operationId"] == token, timeout=20
    )["payload"]
    assert progress["total"] == 1_000_000
    agent.cancel(capability)
    assert agent.result_of(call_id)["payload"]["cancelled"] is True
    # The worker logs "stopped on cancel" only when JobAborted ended the work.
    job = wait_stopped_by_cancel(stack, agent, capability)
    assert not job.hard_killed


def test_a_programs_process_group_is_killed_with_its_call(
    stack: Stack, agent: Agent, tmp_path: Path
) -> None:
    # tests/testapp: `sleep 60` through ctx.run_process, its pid written to a file.
    pid_file = tmp_path / "child.pid"
    call_id = agent.call("test.child", {"pid_file": str(pid_file)}, call_id="child")
    pid = int(eventually(lambda: read_pid(pid_file), timeout=20))
    assert process_alive(pid)
    agent.cancel("child")
    assert agent.result_of(call_id)["payload"]["cancelled"] is True
    assert eventually(lambda: not process_alive(pid), timeout=10)
    job = wait_stopped_by_cancel(stack, agent, "child")
    assert not job.hard_killed


def read_pid(pid_file: Path) -> str | None:
    return pid_file.read_text().strip() or None if pid_file.exists() else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
