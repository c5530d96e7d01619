"""Refuse an over-limit upload from its headers, before Daphne reads the body.

Daphne (through twisted.web) reads a request's whole body into memory or a temporary
file before any ASGI application sees the request, so the upload route's own 411/413
come after the bytes arrived. Twisted calls `Request.gotLength` once the headers are
in and before the first body byte: there, a `POST`/`PUT` to the upload route whose
Content-Length is missing (chunked) or over ABP_MAX_UPLOAD_BYTES is answered with the
route's own JSON error and the connection closed, which stops reading from the socket.

`install()` patches Daphne's request class; it is meant to be called once by
capabilities/asgi.py at start, beside its other Daphne adjustments.
"""

from __future__ import annotations

import json
from typing import Any

from capabilities.web import uploads

UPLOAD_PATH = uploads.PATH.encode()
_REASONS = {411: b"Length Required", 413: b"Content Too Large"}


def refusal(method: bytes, path: bytes, length: int | None) -> tuple[int, dict[str, Any]] | None:
    """The status and JSON body refusing this request now, or None to read its body."""
    if method not in (b"POST", b"PUT") or path.split(b"?", 1)[0].rstrip(b"/") != UPLOAD_PATH:
        return None
    try:
        uploads.declared_length(None if length is None else str(length))
    except uploads.UploadHTTPError as refused:
        return refused.status, {"error": refused.error.to_json()}
    return None


def install() -> None:
    """Make Daphne answer over-limit uploads from their headers (idempotent)."""
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest.gotLength, "abp_upload_limit", False):
        return
    read_body = WebRequest.gotLength

    def got_length(self: Any, length: int | None) -> None:
        channel = self.channel
        refused = refusal(getattr(channel, "_command", b""), getattr(channel, "_path", b""), length)
        if refused is None:
            read_body(self, length)
            return
        read_body(self, 0)  # an empty body: nothing more is read
        # No "100 Continue" after the answer (twisted sends one after this method).
        self.requestHeaders.removeHeader(b"Expect")
        status, body = refused
        channel.transport.write(_response(status, json.dumps(body).encode()))
        channel.transport.loseConnection()  # stops reading the socket

    got_length.abp_upload_limit = True  # type: ignore[attr-defined]
    WebRequest.gotLength = got_length


def _response(status: int, body: bytes) -> bytes:
    head = (
        b"HTTP/1.1 %d %s\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n"
        b"Cache-Control: no-store\r\n"
        b"Connection: close\r\n\r\n"
    ) % (status, _REASONS[status], len(body))
    return head + body
