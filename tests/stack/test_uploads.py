"""Uploads (our extension, docs/uploads.md): raw bytes in, a reference a call names.

The route and the calls run on the real stack; the reference checks, the worker's
restore and retention are also tested in-process, where they have seams.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import time
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.test import override_settings
from PIL import Image

from capabilities.access.agent_keys import create_key
from capabilities.conf import abp_settings
from capabilities.jobs import inputs, retention, uploads
from capabilities.models import AgentSession, Job
from capabilities.protocol import ErrorCode
from capabilities.work.context import CapabilityError
from tests.support.agent import Agent
from tests.support.stack import Stack

pytestmark = pytest.mark.usefixtures("database")


def jpeg(size: tuple[int, int] = (1200, 900)) -> bytes:
    """A photo-like JPEG: smooth gradients."""
    across = Image.linear_gradient("L").rotate(90).resize(size)
    down = Image.linear_gradient("L").resize(size)
    buffer = io.BytesIO()
    Image.merge("RGB", (across, down, Image.new("L", size, 128))).save(buffer, "JPEG")
    return buffer.getvalue()


def put(
    stack: Stack,
    body: bytes | None,
    *,
    session: str | uuid.UUID | None,
    key: str | None = "",
    headers: dict[str, str] | None = None,
    method: str = "PUT",
) -> tuple[int, dict[str, Any]]:
    """An upload to the stack's Daphne; the status and the JSON answer."""
    sent = dict(headers or {})
    key = os.environ["ABP_TEST_AGENT_KEY"] if key == "" else key
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    if session is not None:
        sent["ABP-Session"] = str(session)
    sent.setdefault("Content-Type", "image/jpeg")
    connection = http.client.HTTPConnection("127.0.0.1", stack.web_port, timeout=30)
    try:
        connection.request(method, "/abp/uploads", body=body, headers=sent)
        response = connection.getresponse()
        body = response.read()
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Cache-Control"] == "no-store"
        return response.status, json.loads(body)
    finally:
        connection.close()


def image_call(agent: Agent, image: dict[str, Any]) -> dict[str, Any]:
    """process.image to 300x225 of `image`; the call-result's payload."""
    params = {"image": image, "operations": [{"type": "resize", "width": 300, "height": 225}]}
    payload: dict[str, Any] = agent.result_of(agent.call("process.image", params))["payload"]
    return payload


def refused_path(payload: dict[str, Any]) -> str:
    assert payload["success"] is False, payload
    assert payload["error"]["code"] == ErrorCode.INVALID_PARAMS
    path: str = payload["error"]["details"]["path"]
    return path


# --- the route and calls, on the real stack -------------------------------------------


def test_upload_then_process_image_by_reference(stack: Stack, agent: Agent) -> None:
    data = jpeg()
    status, reference = put(stack, data, session=agent.session_id)
    assert status == 201, reference
    assert reference["size"] == len(data)
    assert reference["mimeType"] == "image/jpeg"
    assert set(reference) == {"uploadId", "size", "mimeType", "expiresAt"}
    # The answer is passed back as it is.
    payload = image_call(agent, reference)
    assert payload["success"] is True, payload
    assert (payload["data"]["width"], payload["data"]["height"]) == (300, 225)
    output = Image.open(
        io.BytesIO(__import__("base64").b64decode(payload["data"]["image"]["content"]))
    )
    assert output.size == (300, 225)
    job = Job.objects.get(session_id=agent.session_id, call_id=payload["callId"])
    # Never through the row nor a base64 string: the row holds the reference only.
    assert job.params["image"] == reference
    assert job.spilled == {}
    # The upload stays usable until it expires (several calls may name it).
    assert image_call(agent, {"uploadId": reference["uploadId"]})["success"] is True


def test_an_upload_is_stored_once_under_its_session(stack: Stack, agent: Agent) -> None:
    status, reference = put(stack, b"\x00\x01raw bytes", session=agent.session_id)
    assert status == 201
    upload = uploads.resolve(reference["uploadId"], str(agent.session_id))
    assert upload.name.startswith(f"uploads/{agent.session_id.hex}/")
    assert uploads.read(upload) == b"\x00\x01raw bytes"


def test_another_session_s_reference_is_refused(stack: Stack, agent: Agent) -> None:
    status, reference = put(stack, jpeg((64, 48)), session=agent.session_id)
    assert status == 201
    with Agent(stack.ws_url) as other:
        other.initialize()
        assert refused_path(image_call(other, reference)) == "params.image.uploadId"
        # Refused with the call's checks: no job was stored for it.
        assert not Job.objects.filter(session_id=other.session_id).exists()


def test_another_principal_can_neither_upload_to_nor_use_a_session(
    stack: Stack, agent: Agent
) -> None:
    _, other_key = create_key("uploads: another principal")
    status, answer = put(stack, b"x", session=agent.session_id, key=other_key)
    assert status == 404
    assert answer["error"]["code"] == ErrorCode.SESSION_INVALID
    status, reference = put(stack, jpeg((64, 48)), session=agent.session_id)
    assert status == 201
    with Agent(stack.ws_url, key=other_key) as other:
        other.initialize()
        assert refused_path(image_call(other, reference)) == "params.image.uploadId"
        assert not Job.objects.filter(session_id=other.session_id).exists()


def test_expired_and_forged_references_are_refused(
    stack: Stack, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    an_hour_ago = time.time() - 3600
    with monkeypatch.context() as past:
        past.setattr(time, "time", lambda: an_hour_ago)
        expired = uploads.store(
            str(agent.session_id), io.BytesIO(jpeg((64, 48))), size=0, mime_type="image/jpeg"
        ).reference()
    payload = image_call(agent, expired)
    assert refused_path(payload) == "params.image.uploadId"
    assert "expired" in payload["error"]["message"]
    _, reference = put(stack, jpeg((64, 48)), session=agent.session_id)
    forged = reference["uploadId"][:-3] + (
        "AAA" if not reference["uploadId"].endswith("AAA") else "BBB"
    )
    assert refused_path(image_call(agent, {"uploadId": forged})) == "params.image.uploadId"
    assert not Job.objects.filter(session_id=agent.session_id).exists()


def test_a_reference_with_content_too_is_refused(stack: Stack, agent: Agent) -> None:
    _, reference = put(stack, jpeg((64, 48)), session=agent.session_id)
    payload = image_call(agent, {**reference, "content": "aGk="})
    assert refused_path(payload) == "params.image"


def test_over_the_limit_is_413_from_the_headers_and_nothing_is_stored(
    stack: Stack, agent: Agent
) -> None:
    limit = abp_settings().MAX_UPLOAD_BYTES
    connection = http.client.HTTPConnection("127.0.0.1", stack.web_port, timeout=30)
    try:
        # The headers alone: the answer comes without a byte of the body sent.
        connection.putrequest("PUT", "/abp/uploads")
        connection.putheader("Authorization", f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}")
        connection.putheader("ABP-Session", str(agent.session_id))
        connection.putheader("Content-Length", str(limit + 1))
        connection.endheaders()
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 413
    assert answer["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert answer["error"]["details"] == {
        "reason": "too-large",
        "limit": limit,
        "size": limit + 1,
    }
    assert not default_storage.exists(uploads.folder(str(agent.session_id)))


def test_a_body_without_length_is_411(stack: Stack, agent: Agent) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", stack.web_port, timeout=30)
    try:
        # The headers alone, as for 413: the answer comes from them and the connection
        # is closed at once, so a chunked body sent after them could meet that close.
        connection.putrequest("POST", "/abp/uploads")
        connection.putheader("Authorization", f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}")
        connection.putheader("ABP-Session", str(agent.session_id))
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 411
        assert json.loads(response.read())["error"]["details"]["reason"] == "length-required"
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("key", "reason"), [(None, "missing-credentials"), ("abp_nope_nope", "invalid-credentials")]
)
def test_without_a_valid_credential_it_is_401(
    stack: Stack, agent: Agent, key: str | None, reason: str
) -> None:
    status, answer = put(stack, b"x", session=agent.session_id, key=key)
    assert status == 401
    assert answer["error"]["code"] == ErrorCode.PERMISSION_DENIED
    assert answer["error"]["details"]["reason"] == reason


def test_the_session_header_is_required_and_checked(stack: Stack, agent: Agent) -> None:
    status, answer = put(stack, b"x", session=None)
    assert (status, answer["error"]["code"]) == (400, ErrorCode.MISSING_PARAM)
    for unknown in (uuid.uuid4(), "not-a-session"):
        status, answer = put(stack, b"x", session=unknown)
        assert (status, answer["error"]["code"]) == (404, ErrorCode.SESSION_INVALID)


def test_an_ended_session_takes_no_upload(stack: Stack) -> None:
    with Agent(stack.ws_url) as ended:
        ended.initialize()
        session_id = ended.session_id
        ended.send("shutdown", {})
        ended.read_until_closed()
    status, _ = put(stack, b"x", session=session_id)
    assert status == 404


def test_other_methods_and_hosts_are_refused(stack: Stack, agent: Agent) -> None:
    status, answer = put(stack, None, session=agent.session_id, method="GET")
    assert (status, answer["error"]["code"]) == (405, ErrorCode.INVALID_PARAMS)
    status, answer = put(stack, b"x", session=agent.session_id, headers={"Host": "evil.example"})
    assert (status, answer["error"]["details"]) == (400, {"header": "Host"})


def test_other_paths_still_reach_django(stack: Stack) -> None:
    # The route sits in front of Django (capabilities/asgi.py): the rest is Django's.
    connection = http.client.HTTPConnection("127.0.0.1", stack.web_port, timeout=30)
    try:
        connection.request("GET", "/abp.json")
        response = connection.getresponse()
        assert response.status == 200
        assert "capabilities" in json.loads(response.read())
    finally:
        connection.close()


# --- in-process seams -----------------------------------------------------------------


def _session(principal: str = "key:test") -> str:
    return str(AgentSession.objects.create(agent_name="uploads", principal=principal).id)


def test_refusal_at_call_time_binds_session_expiry_and_size() -> None:
    mine, theirs = _session(), _session()
    upload = uploads.store(mine, io.BytesIO(b"12345"), size=5, mime_type="image/png")
    params = {"image": upload.reference(), "operations": []}
    assert uploads.refusal(mine, "process.image", params) is None
    foreign = uploads.refusal(theirs, "process.image", params)
    assert foreign is not None
    assert foreign.details == {"path": "params.image.uploadId"}
    later = upload.expires_at + 1
    with pytest.raises(uploads.UploadRefused, match="expired"):
        uploads.resolve(upload.reference()["uploadId"], mine, at=later)
    with override_settings(ABP={**settings.ABP, "MAX_IMAGE_BYTES": 4}):
        too_big = uploads.refusal(mine, "process.image", params)
    assert too_big is not None
    assert too_big.details == {"path": "params.image.uploadId", "limit": 4}


def test_a_short_body_is_not_kept() -> None:
    with pytest.raises(uploads.UploadRefused, match="ended after 3 of 10"):
        uploads.store(_session(), io.BytesIO(b"abc"), size=10, mime_type="image/png")


def test_the_worker_gets_bytes_or_the_refusal() -> None:
    session = AgentSession.objects.create(agent_name="uploads", principal="key:test")
    upload = uploads.store(str(session.id), io.BytesIO(b"\x89PNG"), size=4, mime_type="image/png")
    job = Job.objects.create(session=session, call_id="c", capability="process.image", params={})
    params = {"image": upload.reference(), "operations": []}
    restored = inputs.restore(str(job.id), params, {})
    assert restored["image"]["content"] == b"\x89PNG"
    other = Job.objects.create(
        session=AgentSession.objects.create(agent_name="other", principal="key:test"),
        call_id="c",
        capability="process.image",
        params={},
    )
    refused = inputs.restore(str(other.id), params, {})["image"]["content"]
    assert isinstance(refused, CapabilityError)
    assert refused.details == {"path": "params.image.uploadId"}
    default_storage.delete(upload.name)
    gone = inputs.restore(str(job.id), params, {})["image"]["content"]
    assert isinstance(gone, CapabilityError)
    assert "no longer kept" in gone.message


def test_retention_deletes_uploads_past_their_last_use() -> None:
    folder = uploads.folder(_session())
    now = int(time.time())
    last_use = abp_settings().MAX_TIMEOUT_MS // 1000
    old = default_storage.save(f"{folder}{now - last_use - 10}-{'a' * 32}", ContentFile(b"o"))
    # Expired, but a call accepted just before that may still be waiting for a worker.
    recent = default_storage.save(f"{folder}{now - 10}-{'b' * 32}", ContentFile(b"r"))
    live = default_storage.save(f"{folder}{now + 600}-{'c' * 32}", ContentFile(b"l"))
    retention.clean_up()
    assert not default_storage.exists(old)
    assert default_storage.exists(recent)
    assert default_storage.exists(live)
