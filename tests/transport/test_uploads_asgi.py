"""The upload route's ASGI application, in-process: routing, bodies, answers, S3.

tests/stack/test_uploads.py runs the route on the real stack (Daphne); Daphne hands an
application only whole bodies, so what a short or abandoned body does, and the write
path to an S3 store, are driven here through ASGI messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from django.conf import settings
from django.core.files.storage import default_storage
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from capabilities.access import agent_keys
from capabilities.jobs import uploads
from capabilities.models import AgentSession
from capabilities.protocol import ErrorCode
from capabilities.web import upload_body
from capabilities.web import uploads as route

pytestmark = pytest.mark.usefixtures("database")

Answer = tuple[int, dict[str, str], dict[str, Any]]


def _session() -> str:
    """An open session of the suite's agent key."""
    prefix = agent_keys.prefix_of(os.environ["ABP_TEST_AGENT_KEY"])
    return str(AgentSession.objects.create(agent_name="asgi", principal=f"key:{prefix}").id)


def _scope(session: str, length: int | None, **headers: str) -> dict[str, Any]:
    sent = {
        "host": "127.0.0.1",
        "authorization": f"Bearer {os.environ['ABP_TEST_AGENT_KEY']}",
        "abp-session": session,
        "content-type": "image/png",
        **({} if length is None else {"content-length": str(length)}),
        **headers,
    }
    return {
        "type": "http",
        "method": "PUT",
        "path": route.PATH,
        "query_string": b"",
        "headers": [(name.encode(), value.encode()) for name, value in sent.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


def _call(scope: dict[str, Any], messages: list[dict[str, Any]]) -> Answer | None:
    """Run the route on `scope`, fed `messages`; the answer, or None if it sent none."""
    incoming = iter(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(incoming)

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(route.in_front_of(_not_django)(scope, receive, send))
    if not sent:
        return None
    start, body = sent
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, json.loads(body["body"])


async def _not_django(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError(f"{scope['path']} reached Django")


def _chunks(data: bytes, size: int = 8192) -> list[dict[str, Any]]:
    """`data` as a server sends it: `http.request` messages of `size` bytes."""
    pieces = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    return [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]


def _stored(session: str) -> list[str]:
    folder = uploads.folder(session)
    return default_storage.listdir(folder)[1] if default_storage.exists(folder) else []


def test_a_body_reads_as_a_file_across_its_chunks() -> None:
    body = upload_body.Chunks(deque([b"abc", b"", b"defgh", b"ij"]))
    assert [body.read(2), body.read(4), body.read(0), body.read(), body.read(5)] == [
        b"ab",
        b"cdef",
        b"",
        b"ghij",
        b"",
    ]


@given(
    pieces=st.lists(st.binary(max_size=64), max_size=8),
    sizes=st.lists(st.integers(min_value=-1, max_value=100), max_size=20),
)
def test_a_body_read_in_any_sizes_gives_back_its_bytes_in_order(
    pieces: list[bytes], sizes: list[int]
) -> None:
    body = upload_body.Chunks(deque(pieces))
    whole = b"".join(pieces)
    read = b""
    for size in sizes:
        part = body.read(size)
        assert len(part) == (
            len(whole) - len(read) if size < 0 else min(size, len(whole) - len(read))
        )
        read += part
    assert read + body.read() == whole


def test_only_its_path_is_taken_from_django() -> None:
    reached: list[tuple[str, str]] = []

    async def django(scope: Any, receive: Any, send: Any) -> None:
        reached.append((scope["type"], scope["path"]))

    app = route.in_front_of(django)
    for kind, path in [
        ("http", "/abp/uploads/"),
        ("http", "/abp/uploadsx"),
        ("http", "/admin/"),
        ("websocket", route.PATH),
    ]:
        asyncio.run(app({"type": kind, "path": path}, None, None))  # type: ignore[arg-type]
    assert reached == [
        ("http", "/abp/uploads/"),
        ("http", "/abp/uploadsx"),
        ("http", "/admin/"),
        ("websocket", route.PATH),
    ]


def test_the_body_in_chunks_is_stored_whole() -> None:
    session = _session()
    data = os.urandom(100_000)
    answer = _call(_scope(session, len(data)), _chunks(data))
    assert answer is not None
    status, headers, body = answer
    assert status == 201
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"] == "application/json"
    assert (body["size"], body["mimeType"]) == (len(data), "image/png")
    assert uploads.read(uploads.resolve(body["uploadId"], session)) == data


def test_a_body_shorter_than_its_length_is_400_and_not_kept() -> None:
    session = _session()
    answer = _call(_scope(session, 10), _chunks(b"abc"))
    assert answer is not None
    status, _, body = answer
    assert (status, body["error"]["code"]) == (400, ErrorCode.INVALID_PARAMS)
    assert "ended after 3 of 10" in body["error"]["message"]
    assert _stored(session) == []


def test_a_client_gone_mid_body_gets_no_answer_and_nothing_is_kept() -> None:
    session = _session()
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.disconnect"},
    ]
    assert _call(_scope(session, 10), messages) is None
    assert _stored(session) == []


def test_refusals_carry_their_headers() -> None:
    session = _session()
    answer = _call(_scope(session, 1, authorization=""), _chunks(b"x"))
    assert answer is not None
    status, headers, body = answer
    assert status == 401
    assert headers["www-authenticate"] == 'Bearer realm="abp"'
    assert headers["cache-control"] == "no-store"
    assert body["error"]["details"] == {"reason": "missing-credentials"}
    answer = _call({**_scope(session, 1), "method": "GET"}, _chunks(b"x"))
    assert answer is not None
    assert (answer[0], answer[1]["allow"]) == (405, "POST, PUT")


def test_the_host_is_django_s_rule() -> None:
    session = _session()
    answer = _call(_scope(session, 1, host="evil.example"), _chunks(b"x"))
    assert answer is not None
    status, _, body = answer
    assert (status, body["error"]["code"]) == (400, ErrorCode.INVALID_PARAMS)
    assert body["error"]["details"] == {"header": "Host"}
    with override_settings(ALLOWED_HOSTS=[".example"]):
        answer = _call(_scope(session, 1, host="evil.example:8000"), _chunks(b"x"))
    assert answer is not None
    assert answer[0] == 201


def test_a_query_string_credential_is_not_taken() -> None:
    scope = _scope(_session(), 1, authorization="")
    scope["query_string"] = f"access_token={os.environ['ABP_TEST_AGENT_KEY']}".encode()
    answer = _call(scope, _chunks(b"x"))
    assert answer is not None
    assert answer[0] == 401


BUCKET = "abp-uploads-test"


@pytest.fixture
def s3() -> Iterator[Any]:
    """Django's default storage on an S3 bucket (moto's in-process S3)."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        storage = {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": BUCKET,
                "region_name": "us-east-1",
                "access_key": "testing",
                "secret_key": "testing",
                "location": "abp",
            },
        }
        with override_settings(STORAGES={**settings.STORAGES, "default": storage}):
            yield client


def test_an_upload_to_s3_is_one_object_of_the_body(s3: Any) -> None:
    session = _session()
    data = os.urandom(300_000)
    answer = _call(_scope(session, len(data)), _chunks(data))
    assert answer is not None
    status, _, body = answer
    assert status == 201, body
    upload = uploads.resolve(body["uploadId"], session)
    stored = s3.get_object(Bucket=BUCKET, Key=f"abp/{upload.name}")
    assert stored["Body"].read() == data
    assert uploads.read(upload) == data
    assert upload.name.startswith(f"uploads/{uuid.UUID(session).hex}/")
