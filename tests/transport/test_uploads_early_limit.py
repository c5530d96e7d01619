"""Daphne refuses an over-limit upload from its headers alone (uploads_early_limit.py).

Daphne's own HTTP protocol, fed bytes through twisted's in-memory transport: no
server, no socket. The body is never sent, and the answer still comes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from capabilities.conf import abp_settings
from capabilities.web import uploads_early_limit


class _Server:
    """What Daphne's request asks of its server, recorded."""

    def __init__(self) -> None:
        self.applications: list[dict[str, Any]] = []

    def protocol_connected(self, protocol: object) -> None:
        pass

    def protocol_disconnected(self, protocol: object) -> None:
        pass

    def create_application(self, protocol: object, scope: dict[str, Any]) -> None:
        self.applications.append(scope)


@pytest.fixture
def daphne() -> Iterator[tuple[Any, StringTransport, _Server]]:
    read_body = WebRequest.gotLength
    uploads_early_limit.install()
    uploads_early_limit.install()  # twice: still one check
    server = _Server()
    channel = HTTPFactory(server).buildProtocol(IPv4Address("TCP", "127.0.0.1", 5))
    transport = StringTransport()  # type: ignore[no-untyped-call]
    channel.makeConnection(transport)
    try:
        yield channel, transport, server
    finally:
        WebRequest.gotLength = read_body


def _headers(method: str, path: str, **headers: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(transport: StringTransport) -> tuple[int, dict[str, Any]]:
    sent: bytes = transport.value()  # type: ignore[no-untyped-call]
    head, _, body = sent.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_over_the_limit_is_answered_before_the_body(daphne: Any) -> None:
    channel, transport, server = daphne
    size = abp_settings().MAX_UPLOAD_BYTES + 1
    channel.dataReceived(
        _headers("PUT", "/abp/uploads", **{"Content-Length": str(size), "Expect": "100-continue"})
    )
    status, answer = _answer(transport)
    assert status == 413
    assert answer["error"]["details"]["reason"] == "too-large"
    assert b"100 Continue" not in transport.io.getvalue()
    assert transport.disconnecting  # stops reading: the body is never taken in
    assert server.applications == []


def test_chunked_without_length_is_answered_411(daphne: Any) -> None:
    channel, transport, server = daphne
    channel.dataReceived(_headers("POST", "/abp/uploads?x=1", **{"Transfer-Encoding": "chunked"}))
    status, answer = _answer(transport)
    assert status == 411
    assert answer["error"]["details"]["reason"] == "length-required"
    assert server.applications == []


@pytest.mark.parametrize(("method", "path"), [("PUT", "/abp/uploads"), ("PUT", "/admin/x")])
def test_other_requests_are_read_as_before(daphne: Any, method: str, path: str) -> None:
    channel, transport, _ = daphne
    length = 10 if path == "/abp/uploads" else abp_settings().MAX_UPLOAD_BYTES + 1
    channel.dataReceived(_headers(method, path, **{"Content-Length": str(length)}))
    assert transport.io.getvalue() == b""
    assert not transport.disconnecting
