"""Result files and spilled inputs on an S3-compatible store: a real S3 over HTTP.

moto's standalone server speaks the S3 HTTP API on a loopback port. Beside the
suite's stack, and sharing its database, an S3 stack runs with
ABP_STORAGE_BACKEND=s3 pointing at it: its own Redis (so the suite's dispatchers
never see its worker), a Celery worker with one child on a queue of its own, and
two Daphnes, one streaming downloads and one redirecting them to the store's
signed URLs. Nothing here touches the filesystem's media root.

moto does not check signatures or the expiry of presigned URLs, so what the
store's URL says (signed, SigV4, how long it lives, the headers it asks for) is
read off the URL; our own refusals (403, 410) are checked over HTTP.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from django.core import signing
from django.utils import timezone
from PIL import Image

from capabilities.jobs import download_links
from capabilities.models import AgentSession, Job, JobStatus
from tests.support.agent import Agent
from tests.support.paths import ROOT
from tests.support.stack import (
    ManagedProcess,
    Stack,
    free_port,
    port_open,
    python_tool,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

BUCKET = "abp-results"
PREFIX = "abp"  # ABP_S3_PREFIX: every object of the stack is under it
QUEUE = "abp.s3"
BIG = 300 * 1024  # above the tests' 256 KiB inline limit
REDIRECT_SECONDS = 30


@dataclass
class S3Stack:
    """The S3 endpoint, a client of it, and the S3 stack's two Daphnes (host:port)."""

    endpoint: str
    client: Any
    streaming: str
    redirecting: str
    env: dict[str, str]
    media_root: Path

    def key(self, name: str) -> str:
        """The object key of a storage name."""
        return f"{PREFIX}/{name}"

    def read(self, name: str) -> bytes:
        """The stored object's bytes."""
        body: bytes = self.client.get_object(Bucket=BUCKET, Key=self.key(name))["Body"].read()
        return body

    def keys(self, folder: str) -> list[str]:
        """Every key under a storage folder."""
        listed = self.client.list_objects_v2(Bucket=BUCKET, Prefix=self.key(folder))
        return [entry["Key"] for entry in listed.get("Contents", [])]

    def agent(self, web: str) -> Agent:
        """An initialized agent on one of the S3 stack's Daphnes."""
        connected = Agent(f"ws://{web}/abp/ws")
        connected.initialize()
        return connected

    def clean_up(self) -> tuple[int, int]:
        """One retention pass, in a process of its own with the S3 stack's settings."""
        script = (
            "import json, django; django.setup(); "
            "from capabilities.jobs import retention; print(json.dumps(retention.clean_up()))"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        folders, rows = json.loads(done.stdout.strip().splitlines()[-1])
        return int(folders), int(rows)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Stack]:
    run_dir = Path(tempfile.mkdtemp(prefix="abp-s3-"))
    moto_port, redis_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{moto_port}"
    moto = ManagedProcess(
        "moto-s3", python_tool("moto.server", "-H", "127.0.0.1", "-p", str(moto_port)), run_dir
    )
    # A stack object for its Redis and its Daphne command line; its own worker, beat
    # and web are never started.
    s3_stack = Stack(run_dir, redis_port)
    media_root = run_dir / "media"
    env = {
        "ABP_STORAGE_BACKEND": "s3",
        "ABP_S3_BUCKET": BUCKET,
        "ABP_S3_ENDPOINT_URL": endpoint,
        "ABP_S3_REGION": "us-east-1",
        "ABP_S3_ACCESS_KEY_ID": "testing",
        "ABP_S3_SECRET_ACCESS_KEY": "testing",
        "ABP_S3_PREFIX": PREFIX,
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "ABP_CAPABILITY_QUEUES": f"test.sleep={QUEUE},process.image={QUEUE}",
        # Where a file written to the filesystem by mistake would show.
        "DJANGO_MEDIA_ROOT": str(media_root),
    }
    worker = ManagedProcess(
        "worker-s3",
        python_tool(
            "celery", "-A", "abpsite", "worker", "-Q", QUEUE, "-P", "prefork", "-c", "1",
            "-l", "info", "-n", f"worker-s3-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle",
        ),
        run_dir,
        env,
    )  # fmt: skip
    ports = free_port(), free_port()
    webs = [
        s3_stack.new_web(ports[0], name="daphne-s3-stream", env=env),
        s3_stack.new_web(
            ports[1],
            name="daphne-s3-redirect",
            env={
                **env,
                "ABP_DOWNLOAD_REDIRECT": "1",
                "ABP_DOWNLOAD_REDIRECT_SECONDS": str(REDIRECT_SECONDS),
            },
        ),
    ]
    processes = [moto, s3_stack.redis, worker, *webs]
    try:
        moto.start(lambda: port_open(moto_port))
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        s3_stack.redis.start(lambda: port_open(redis_port))
        worker.start(lambda: " ready." in worker.log_text())
        webs[0].start(lambda: port_open(ports[0]))
        webs[1].start(lambda: port_open(ports[1]))
        yield S3Stack(
            endpoint=endpoint,
            client=client,
            streaming=f"127.0.0.1:{ports[0]}",
            redirecting=f"127.0.0.1:{ports[1]}",
            env=env,
            media_root=media_root,
        )
    finally:
        for process in reversed(processes):
            process.stop()
        _keep_logs(processes)
        shutil.rmtree(run_dir, ignore_errors=True)


def _keep_logs(processes: list[ManagedProcess]) -> None:
    artifacts = Path(os.environ.get("ABP_TEST_ARTIFACTS", ROOT / "var" / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    for process in processes:
        if process.log_path.exists():
            (artifacts / process.log_path.name).write_text(process.log_text())


def big_result(agent: Agent, call_id: str) -> tuple[Job, dict[str, Any]]:
    """A call whose file result is too large to inline: its job and reference."""
    call = agent.call("test.sleep", {"steps": 0, "fileBytes": BIG}, call_id=call_id)
    payload = agent.result_of(call)["payload"]
    assert payload["success"] is True, payload
    job = Job.objects.get(session_id=agent.session_id, call_id=call_id)
    return job, payload["data"]["file"]


def stored_name(job: Job) -> str:
    """The storage name of the job's file result."""
    assert job.result is not None
    name: str = job.result["file"]["$file"]
    return name


def fetch(url: str) -> http.client.HTTPResponse:
    """GET without following redirects."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=10)
    connection.request("GET", f"{parts.path}?{parts.query}" if parts.query else parts.path)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def on(web: str, url: str) -> str:
    """The same download URL on another Daphne (tokens do not name a host)."""
    return f"http://{web}{urlsplit(url).path}"


def test_results_are_stored_in_the_bucket_and_streamed(s3: S3Stack) -> None:
    with s3.agent(s3.streaming) as agent:
        small = agent.call("test.sleep", {"steps": 0, "fileBytes": 1000}, call_id="small")
        inline = agent.result_of(small)["payload"]["data"]["file"]
        small_job = Job.objects.get(session_id=agent.session_id, call_id="small")
        # Inlined from what the worker wrote to the bucket.
        assert base64.b64decode(inline["content"]) == s3.read(stored_name(small_job))
        job, reference = big_result(agent, "big")
    name = stored_name(job)
    assert name == f"results/{job.id}/blob.bin"
    assert s3.keys(f"results/{job.id}/") == [f"{PREFIX}/{name}"]
    url = str(reference["downloadUrl"])
    assert url.startswith(f"http://{s3.streaming}/abp/files/")
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["Content-Length"] == str(BIG)
        assert response.headers["Content-Disposition"] == 'attachment; filename="blob.bin"'
        assert response.headers["Cache-Control"] == "private, no-store"
    assert len(body) == BIG
    assert body == s3.read(name)
    # Nothing went to the filesystem.
    assert not s3.media_root.exists()


def test_redirects_to_a_short_lived_signed_url_of_the_store(s3: S3Stack) -> None:
    with s3.agent(s3.redirecting) as agent:
        job, reference = big_result(agent, "redirected")
    url = str(reference["downloadUrl"])
    assert url.startswith(f"http://{s3.redirecting}/abp/files/")
    answer = fetch(url)
    assert answer.status == 302
    assert answer.headers["Cache-Control"] == "private, no-store"
    location = answer.headers["Location"]
    target = urlsplit(location)
    assert f"{target.scheme}://{target.netloc}" == s3.endpoint
    assert target.path == f"/{BUCKET}/{PREFIX}/{stored_name(job)}"
    query = {key: values[0] for key, values in parse_qs(target.query).items()}
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Signature"]
    assert 1 <= int(query["X-Amz-Expires"]) <= REDIRECT_SECONDS
    assert query["response-content-disposition"] == 'attachment; filename="blob.bin"'
    assert query["response-content-type"] == "application/octet-stream"
    # Followed, as a client does: the bytes, under the headers we asked the store for.
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
        assert response.url.startswith(s3.endpoint)
        assert response.headers["Content-Disposition"] == 'attachment; filename="blob.bin"'
        assert response.headers["Content-Type"] == "application/octet-stream"
    assert body == s3.read(stored_name(job))
    # The streaming Daphne serves the same link itself.
    with urllib.request.urlopen(on(s3.streaming, url), timeout=10) as response:
        assert response.read() == body


def test_the_store_s_url_never_outlives_the_link(
    s3: S3Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3.agent(s3.redirecting) as agent:
        job, _ = big_result(agent, "nearly-expired")
    # A link issued 3590 s ago: ten seconds left of its hour.
    issued = time.time() - 3590
    with monkeypatch.context() as patched:
        patched.setattr(time, "time", lambda: issued)
        late = download_links.reference(job, _ref(job), base_url=f"http://{s3.redirecting}")
    answer = fetch(str(late["downloadUrl"]))
    assert answer.status == 302
    expires = int(parse_qs(urlsplit(answer.headers["Location"]).query)["X-Amz-Expires"][0])
    assert 1 <= expires <= 10


def _ref(job: Job) -> dict[str, Any]:
    assert job.result is not None
    ref: dict[str, Any] = job.result["file"]
    return ref


@pytest.mark.parametrize("web", ["streaming", "redirecting"])
def test_another_sessions_link_is_forbidden(s3: S3Stack, web: str) -> None:
    host = getattr(s3, web)
    with s3.agent(host) as owner, s3.agent(host) as intruder:
        job, reference = big_result(owner, f"owned-{web}")
        # A token the server never issued: the owner's job, the intruder's session.
        forged = signing.dumps(
            {
                "j": job.id.hex,
                "s": intruder.session_id.hex,
                "n": stored_name(job),
                "m": "application/octet-stream",
                "f": "blob.bin",
            },
            salt=download_links.SALT,
            compress=True,
        )
    refused = fetch(f"http://{host}/abp/files/{forged}/blob.bin")
    assert refused.status == 403
    assert refused.headers["Location"] is None
    url = str(reference["downloadUrl"])
    start = url.index("/abp/files/") + len("/abp/files/")
    tampered = url[: start + 5] + ("A" if url[start + 5] != "A" else "B") + url[start + 6 :]
    assert fetch(tampered).status == 403
    # The owner's own link works.
    assert fetch(url).status in {200, 302}


@pytest.mark.parametrize("web", ["streaming", "redirecting"])
def test_an_expired_link_is_gone(s3: S3Stack, web: str, monkeypatch: pytest.MonkeyPatch) -> None:
    host = getattr(s3, web)
    with s3.agent(host) as agent:
        job, _ = big_result(agent, f"expired-{web}")
    issued = time.time() - 3601
    with monkeypatch.context() as patched:
        patched.setattr(time, "time", lambda: issued)
        old = download_links.reference(job, _ref(job), base_url=f"http://{host}")
    answer = fetch(str(old["downloadUrl"]))
    assert answer.status == 410
    assert answer.headers["Location"] is None
    # The object is still there: the refusal is the link's.
    assert s3.keys(f"results/{job.id}/")


def test_past_retention_links_are_gone_and_the_clean_up_deletes_the_objects(
    s3: S3Stack,
) -> None:
    with s3.agent(s3.redirecting) as agent:
        old_job, old_ref = big_result(agent, "old")
        new_job, new_ref = big_result(agent, "new")
    Job.objects.filter(pk=old_job.id).update(settled_at=timezone.now() - timedelta(days=2))
    # Past retention, 410 at once, though the clean-up has not run yet.
    assert s3.keys(f"results/{old_job.id}/")
    for host in (s3.streaming, s3.redirecting):
        assert fetch(on(host, str(old_ref["downloadUrl"]))).status == 410
    folders, _ = s3.clean_up()
    assert folders >= 1
    assert s3.keys(f"results/{old_job.id}/") == []
    assert s3.keys(f"results/{new_job.id}/") == [f"{PREFIX}/{stored_name(new_job)}"]
    for host in (s3.streaming, s3.redirecting):
        assert fetch(on(host, str(old_ref["downloadUrl"]))).status == 410
    assert fetch(on(s3.redirecting, str(new_ref["downloadUrl"]))).status == 302
    with urllib.request.urlopen(on(s3.streaming, str(new_ref["downloadUrl"])), timeout=10) as ok:
        assert ok.read() == s3.read(stored_name(new_job))


def noisy_jpeg() -> str:
    """A JPEG whose base64 is well over the 64 KiB spill threshold."""
    buffer = io.BytesIO()
    Image.effect_noise((400, 400), 60).convert("RGB").save(buffer, "JPEG", quality=95)
    content = base64.b64encode(buffer.getvalue()).decode("ascii")
    assert len(content) > 64 * 1024
    return content


def _job(agent: Agent, call_id: str) -> Job | None:
    return Job.objects.filter(session_id=agent.session_id, call_id=call_id).first()


def _hold_the_worker(agent: Agent, call_id: str) -> None:
    """Keep the S3 worker's one child busy until `call_id` is cancelled."""
    agent.call("test.sleep", {"steps": 3000, "stepMs": 20}, call_id=call_id)
    eventually(
        lambda: (job := _job(agent, call_id)) is not None and job.status == JobStatus.RUNNING
    )


def test_a_spilled_input_goes_to_the_bucket_comes_back_and_is_deleted(s3: S3Stack) -> None:
    content = noisy_jpeg()
    params = {
        "image": {"content": content, "mimeType": "image/jpeg", "encoding": "base64"},
        "operations": [{"type": "grayscale"}],
    }
    with s3.agent(s3.streaming) as agent:
        _hold_the_worker(agent, "hold")
        call = agent.call("process.image", params, call_id="spilled")
        # It waits for the busy worker: its input is in the bucket, not in the row.
        job = eventually(lambda: _job(agent, "spilled"))
        assert job.status == JobStatus.QUEUED
        assert job.params["image"]["content"] is None
        name = job.spilled["image"]["name"]
        assert name == f"inputs/{job.id}/image.txt"
        assert s3.read(name).decode("ascii") == content
        agent.cancel("hold")
        payload = agent.result_of(call, timeout=30)["payload"]
    # The worker read it back whole: the image came out right.
    assert payload["success"] is True, payload
    assert (payload["data"]["width"], payload["data"]["height"]) == (400, 400)
    out = Image.open(io.BytesIO(base64.b64decode(payload["data"]["image"]["content"])))
    assert out.mode == "L"
    # And deleted it once the work was over.
    assert s3.keys(f"inputs/{job.id}/") == []
    assert not s3.media_root.exists()


def test_a_spilled_input_of_a_job_that_never_ran_is_removed_by_retention(s3: S3Stack) -> None:
    params = {
        "image": {"content": noisy_jpeg(), "mimeType": "image/jpeg", "encoding": "base64"},
        "operations": [],
    }
    with s3.agent(s3.streaming) as agent:
        _hold_the_worker(agent, "hold-2")
        call = agent.call("process.image", params, call_id="never-ran")
        job = eventually(lambda: _job(agent, "never-ran"))
        agent.cancel("never-ran")
        assert agent.result_of(call)["payload"]["cancelled"] is True
        agent.cancel("hold-2")
    assert s3.keys(f"inputs/{job.id}/") == [f"{PREFIX}/inputs/{job.id}/image.txt"]
    Job.objects.filter(pk=job.id).update(settled_at=timezone.now() - timedelta(days=2))
    s3.clean_up()
    assert s3.keys(f"inputs/{job.id}/") == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ABP_STORAGE_BACKEND": "ftp"}, "ABP_STORAGE_BACKEND must be filesystem or s3"),
        ({"ABP_STORAGE_BACKEND": "s3", "ABP_S3_BUCKET": ""}, "needs ABP_S3_BUCKET"),
        ({"ABP_DOWNLOAD_REDIRECT": "1"}, "ABP_DOWNLOAD_REDIRECT: needs a store that signs URLs"),
        (
            {
                "ABP_STORAGE_BACKEND": "s3",
                "ABP_S3_BUCKET": "b",
                "ABP_DOWNLOAD_REDIRECT_SECONDS": "0",
            },
            "ABP_DOWNLOAD_REDIRECT_SECONDS: Input should be greater than or equal to 1",
        ),
    ],
)
def test_storage_settings_that_cannot_work_refuse_to_start(
    env: dict[str, str], message: str
) -> None:
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**os.environ, "ABP_STORAGE_BACKEND": "", "ABP_DOWNLOAD_REDIRECT": "", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert message in started.stderr


def test_an_unknown_session_or_job_is_forbidden_not_gone(s3: S3Stack) -> None:
    session = AgentSession.objects.create(agent_name="nobody")
    token = signing.dumps(
        {
            "j": uuid.uuid4().hex,
            "s": session.id.hex,
            "n": "results/x/blob.bin",
            "m": "text/plain",
            "f": "b",
        },
        salt=download_links.SALT,
        compress=True,
    )
    for host in (s3.streaming, s3.redirecting):
        assert fetch(f"http://{host}/abp/files/{token}/b").status == 403


def test_a_link_whose_object_was_deleted_is_gone(s3: S3Stack) -> None:
    with s3.agent(s3.redirecting) as agent:
        job, reference = big_result(agent, "deleted")
    s3.client.delete_object(Bucket=BUCKET, Key=s3.key(stored_name(job)))
    for host in (s3.streaming, s3.redirecting):
        answer = fetch(on(host, str(reference["downloadUrl"])))
        assert answer.status == 410
        assert answer.headers["Location"] is None


def test_a_refusal_is_a_plain_answer_of_ours_never_a_redirect(s3: S3Stack) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{s3.redirecting}/abp/files/not-a-token/b", timeout=10)
    refused.value.close()
    assert refused.value.code == 403
    assert refused.value.headers["Content-Type"] == "text/plain; charset=utf-8"
