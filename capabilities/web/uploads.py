"""`POST`/`PUT /abp/uploads`: raw bytes in, a reference a call may name out (docs/uploads.md).

Our extension to ABP: a large binary input travels once, as bytes, instead of as
base64 inside a JSON frame. A small ASGI application, routed in front of Django
(`in_front_of`, capabilities/asgi.py), so the body goes from the server's `http.request`
messages to storage once: Django's handler would spool it to a temporary file first
and its middleware would run for nothing. The checks, cheapest first, all before the
body is read: the Host (Django's own rule, `HttpRequest.get_host`: 400), the method
(405), `Content-Length` (411 without one, 413 over ABP_MAX_UPLOAD_BYTES), the
credential (the WebSocket's own: an agent key or a page token as `Authorization:
Bearer`, checked by capabilities/access/credentials.py; 401, or 403 for a revoked
key), and `ABP-Session`, which must name an open session of that same principal (404,
as for a session that does not exist). Then the body goes to storage
(capabilities/jobs/uploads.py), off the event loop and off the ORM's thread.

No CSRF check: it protects cookie-authenticated forms, and this route reads no
cookie. Its credential is a bearer header that a cross-site page cannot make a
browser send (a custom header needs a CORS preflight we never grant), or a page token
bound to the Origin the browser sends. Daphne reads a whole request body before any
application sees it, so the 411/413 here come after the bytes arrived;
uploads_early_limit.py refuses them from the headers alone.
"""

from __future__ import annotations

import io
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

from capabilities.access import credentials
from capabilities.access.principal import Principal
from capabilities.jobs import uploads
from capabilities.models import AgentSession
from capabilities.protocol import ErrorCode, WireError
from capabilities.web import upload_body
from capabilities.web.upload_body import Message, Receive

Scope = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]

PATH = "/abp/uploads"
SESSION_HEADER = "ABP-Session"
METHODS = ("POST", "PUT")
_MIME_TYPE = re.compile(r"^[A-Za-z0-9][\w.+-]{0,126}/[A-Za-z0-9][\w.+-]{0,126}$")

logger = logging.getLogger(__name__)


class UploadHTTPError(Exception):
    """The upload is refused: an HTTP status and the coded error."""

    def __init__(self, status: int, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.error = WireError(code=code, message=message, details=details or None)


def in_front_of(django: ASGIApp) -> ASGIApp:
    """HTTP to /abp/uploads goes to `upload`, the rest to Django."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH:
            await upload(scope, receive, send)
        else:
            await django(scope, receive, send)

    return app


async def upload(scope: Scope, receive: Receive, send: Send) -> None:
    """Store the body as an upload of the caller's session; 201 with its reference."""
    try:
        stored = await _stored(scope, receive)
    except UploadHTTPError as refused:
        await _answer(send, refused.status, {"error": refused.error.to_json()})
        return
    except uploads.UploadRefused as refused:  # the body was shorter than announced
        error = WireError(code=ErrorCode.INVALID_PARAMS, message=str(refused))
        await _answer(send, 400, {"error": error.to_json()})
        return
    except upload_body.ClientGone:
        return
    except Exception:
        # The traceback to the log, a coded error to the client (as Django's 500).
        logger.exception("Upload failed")
        error = WireError(code=ErrorCode.INTERNAL_ERROR, message="The upload failed; try again.")
        await _answer(send, 500, {"error": error.to_json()})
        return
    await _answer(send, 201, stored.reference())


async def _stored(scope: Scope, receive: Receive) -> uploads.Upload:
    # The request line and headers as Django reads them (its body is never read).
    request = ASGIRequest(scope, io.BytesIO())
    _check_host(request)
    if request.method not in METHODS:
        raise UploadHTTPError(405, ErrorCode.INVALID_PARAMS, "Use POST or PUT.")
    size = declared_length(request.META.get("CONTENT_LENGTH"))
    session_id = await database_sync_to_async(_session_of_caller)(request, scope)
    body = await upload_body.received(receive)
    return await sync_to_async(uploads.store, thread_sensitive=False)(
        session_id, body, size=size, mime_type=_mime_type(request)
    )


def declared_length(header: str | None) -> int:
    """The body's length from Content-Length; UploadHTTPError: 411 without, 413 over the limit."""
    limit = uploads.max_bytes()
    if not header or not header.isdigit():
        message = "Send the body with a Content-Length (no chunked encoding)."
        raise UploadHTTPError(411, ErrorCode.INVALID_PARAMS, message, reason="length-required")
    size = int(header)
    if size > limit:
        message = f"An upload may be at most {limit} bytes; this one is {size}."
        raise UploadHTTPError(
            413, ErrorCode.INVALID_PARAMS, message, reason="too-large", limit=limit, size=size
        )
    return size


def _check_host(request: HttpRequest) -> None:
    """Django's Host check (ALLOWED_HOSTS), logged as Django logs it, answered in JSON."""
    try:
        request.get_host()
    except DisallowedHost as refused:
        security = logging.getLogger("django.security.DisallowedHost")
        security.error(str(refused), extra={"status_code": 400, "request": request})
        message = "The Host header names no host this app serves."
        raise UploadHTTPError(400, ErrorCode.INVALID_PARAMS, message, header="Host") from None


def _session_of_caller(request: HttpRequest, scope: Scope) -> str:
    """The session the upload is for, once the caller is known to hold it."""
    principal = _principal(scope)
    named = request.headers.get(SESSION_HEADER, "").strip()
    if not named:
        message = f"Name the session the upload is for in the {SESSION_HEADER} header."
        raise UploadHTTPError(400, ErrorCode.MISSING_PARAM, message, header=SESSION_HEADER)
    try:
        session_id = str(uuid.UUID(named))
    except ValueError:
        session_id = ""
    held = session_id and AgentSession.objects.filter(
        pk=session_id, principal=principal.rate_limit_id, closed_at__isnull=True
    )
    if not held or not held.exists():
        # Unknown, ended, or another principal's: one answer, as for a resume.
        message = "No open session of yours has this id."
        raise UploadHTTPError(404, ErrorCode.SESSION_INVALID, message, header=SESSION_HEADER)
    return session_id


def _principal(scope: Scope) -> Principal:
    """Who is calling, by the WebSocket's own rules; UploadHTTPError (401) if nobody we know."""
    # Headers only: a credential in the query string (`access_token`), which the
    # WebSocket takes from clients that can do nothing else, is not taken here.
    try:
        return credentials.authenticate(
            {"headers": scope["headers"], "client": scope.get("client")}
        )
    except credentials.Refused as refused:
        # As the WebSocket's refusals: 4403 there for a revoked key, 4401 for the rest.
        status = 403 if refused.reason == "key-revoked" else 401
        message = f"The app refused the credential: {refused.reason}."
        raise UploadHTTPError(
            status, ErrorCode.PERMISSION_DENIED, message, reason=refused.reason
        ) from refused


def _mime_type(request: HttpRequest) -> str:
    """The body's Content-Type, if it is a plain type/subtype; else octet-stream."""
    given = request.content_type or ""
    return given if _MIME_TYPE.match(given) else uploads.DEFAULT_MIME_TYPE


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    """A JSON answer, never cached."""
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="abp"'))
    elif status == 405:
        headers.append((b"allow", ", ".join(METHODS).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
