"""Results too large to inline: signed, expiring download URLs, and their retention."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta
from urllib.parse import quote

import pytest
from django.core import signing
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.test import Client
from django.utils import timezone

from capabilities.jobs import download_links as downloads
from capabilities.jobs import retention
from capabilities.models import AgentSession, Job, JobStatus
from tests.support.agent import Agent
from tests.support.stack import Stack

pytestmark = pytest.mark.usefixtures("database")

BIG = 300 * 1024  # above the tests' 256 KiB inline limit


def big_result(agent: Agent, call_id: str) -> dict[str, object]:
    call = agent.call("test.sleep", {"steps": 0, "fileBytes": BIG}, call_id=call_id)
    payload = agent.result_of(call)["payload"]
    assert payload["success"] is True
    reference: dict[str, object] = payload["data"]["file"]
    return reference


def test_small_files_are_inline_and_large_ones_are_links(stack: Stack, agent: Agent) -> None:
    small = agent.call("test.sleep", {"steps": 0, "fileBytes": 1000})
    inline = agent.result_of(small)["payload"]["data"]["file"]
    assert inline["encoding"] == "base64"
    assert inline["size"] == 1000
    reference = big_result(agent, "big")
    assert set(reference) == {"downloadUrl", "mimeType", "size", "filename", "expiresAt"}
    assert str(reference["downloadUrl"]).startswith(stack.http_url + "/abp/files/")
    assert reference["size"] == BIG
    expires = datetime.fromisoformat(str(reference["expiresAt"]).replace("Z", "+00:00"))
    assert timedelta(minutes=59) < expires - timezone.now() <= timedelta(hours=1)


def test_download_serves_the_file_with_its_headers(agent: Agent) -> None:
    reference = big_result(agent, "fetch")
    with urllib.request.urlopen(str(reference["downloadUrl"]), timeout=10) as response:
        body = response.read()
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["Content-Length"] == str(BIG)
        assert response.headers["Content-Disposition"] == 'attachment; filename="blob.bin"'
    job = Job.objects.get(session_id=agent.session_id, call_id="fetch")
    assert job.result is not None
    with default_storage.open(job.result["file"]["$file"], "rb") as stored:
        assert body == stored.read()


def test_tampered_link_is_forbidden(agent: Agent) -> None:
    url = str(big_result(agent, "tamper")["downloadUrl"])
    token_start = url.index("/abp/files/") + len("/abp/files/")
    flipped = "A" if url[token_start + 5] != "A" else "B"
    tampered = url[: token_start + 5] + flipped + url[token_start + 6 :]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(tampered, timeout=10)
    refused.value.close()
    assert refused.value.code == 403


def _client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def _stored_job(session: AgentSession, **fields: object) -> tuple[Job, dict[str, object]]:
    job = Job.objects.create(
        session=session,
        call_id=str(uuid.uuid4()),
        capability="test.sleep",
        params={},
        status=JobStatus.SUCCEEDED,
        settled_at=timezone.now(),
        **fields,
    )
    name = default_storage.save(f"results/{job.id}/blob.bin", ContentFile(b"x" * 10))
    ref = {"$file": name, "mimeType": "application/octet-stream", "size": 10, "filename": "b"}
    return job, ref


def test_expired_link_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    job, ref = _stored_job(AgentSession.objects.create(agent_name="a"))
    url = downloads.reference(job, ref, base_url="http://127.0.0.1")["downloadUrl"]
    served = _client().get(url)
    served.close()
    assert served.status_code == 200
    later = time.time() + 3601
    monkeypatch.setattr(time, "time", lambda: later)
    assert _client().get(url).status_code == 410


@pytest.mark.parametrize(
    "name", ["invoice.html", "setup.exe", "Résumé 100%.PDF", "résumé 100%.pdf"]
)
def test_link_under_another_file_name_is_not_found(name: str) -> None:
    job, ref = _stored_job(AgentSession.objects.create(agent_name="renamer"))
    ref["filename"] = "Résumé 100%.pdf"
    url = downloads.reference(job, ref, base_url="http://127.0.0.1")["downloadUrl"]
    token_path = url.rsplit("/", 1)[0]
    assert _client().get(f"{token_path}/{quote(name)}").status_code == 404
    # The signed name, percent-encoded in the URL, is served under that name.
    served = _client().get(url)
    served.close()
    assert served.status_code == 200
    assert "filename*=utf-8''R%C3%A9sum%C3%A9%20100%25.pdf" in served["Content-Disposition"]


def test_link_naming_another_sessions_job_is_forbidden() -> None:
    job, ref = _stored_job(AgentSession.objects.create(agent_name="owner"))
    intruder = AgentSession.objects.create(agent_name="intruder")
    # A token the server never issued: the job, but another session.
    forged = signing.dumps(
        {"j": job.id.hex, "s": intruder.id.hex, "n": ref["$file"], "m": "text/plain", "f": "b"},
        salt=downloads.SALT,
        compress=True,
    )
    assert _client().get(f"/abp/files/{forged}/b").status_code == 403
    # Nor another job's folder, even with its own session.
    other_job, _ = _stored_job(intruder)
    outside = signing.dumps(
        {
            "j": other_job.id.hex,
            "s": intruder.id.hex,
            "n": ref["$file"],
            "m": "text/plain",
            "f": "b",
        },
        salt=downloads.SALT,
        compress=True,
    )
    assert _client().get(f"/abp/files/{outside}/b").status_code == 403


def test_retention_removes_old_files_then_old_rows() -> None:
    session = AgentSession.objects.create(agent_name="old", closed_at=timezone.now())
    old_job, old_ref = _stored_job(session)
    new_job, new_ref = _stored_job(session)
    Job.objects.filter(pk=old_job.id).update(settled_at=timezone.now() - timedelta(days=2))
    url = downloads.reference(old_job, old_ref, base_url="http://127.0.0.1")["downloadUrl"]
    retention.clean_up()
    assert not default_storage.exists(str(old_ref["$file"]))
    assert default_storage.exists(str(new_ref["$file"]))
    assert _client().get(url).status_code == 410
    Job.objects.filter(pk__in=[old_job.id, new_job.id]).update(
        settled_at=timezone.now() - timedelta(days=31)
    )
    AgentSession.objects.filter(pk=session.id).update(closed_at=timezone.now() - timedelta(days=31))
    retention.clean_up()
    assert not Job.objects.filter(pk__in=[old_job.id, new_job.id]).exists()
    assert not AgentSession.objects.filter(pk=session.id).exists()
