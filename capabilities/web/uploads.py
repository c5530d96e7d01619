"""`POST`/`PUT /abp/uploads`: raw bytes in, a reference a call may name out (docs/uploads.md).

Our extension to ABP: a large binary input travels once, as bytes, instead of as
base64 inside a JSON frame. The checks, cheapest first, all before the body is read
by us: the method, `Content-Length` (411 without one, 413 over ABP_MAX_UPLOAD_BYTES),
the credential (the WebSocket's own: an agent key or a page token as `Authorization:
Bearer`, checked by capabilities/access/credentials.py; 401, or 403 for a revoked
key), and `ABP-Session`, which
must name an open session of that same principal (404, as for a session that does not
exist). Then the body goes to storage once (capabilities/jobs/uploads.py), off the
event loop and off the ORM's thread.

Django checks the Host header here as on every route (CommonMiddleware: 400). Daphne
reads a whole request body before any application sees it, so the 411/413 here come
after the bytes arrived; uploads_early_limit.py refuses them from the headers alone.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from capabilities.access import credentials
from capabilities.access.principal import Principal
from capabilities.jobs import uploads
from capabilities.models import AgentSession
from capabilities.protocol import ErrorCode, WireError

SESSION_HEADER = "ABP-Session"
METHODS = ("POST", "PUT")
_MIME_TYPE = re.compile(r"^[A-Za-z0-9][\w.+-]{0,126}/[A-Za-z0-9][\w.+-]{0,126}$")


class UploadHTTPError(Exception):
    """The upload is refused: an HTTP status and the coded error."""

    def __init__(self, status: int, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.error = WireError(code=code, message=message, details=details or None)


# CSRF protects cookie-authenticated forms; this route reads no cookie. Its credential
# is a bearer header that a cross-site page cannot make a browser send (a custom
# header needs a CORS preflight we never grant), or a page token bound to the Origin
# the browser sends. So CsrfViewMiddleware, which would refuse every agent, is off.
@csrf_exempt
async def upload(request: HttpRequest) -> JsonResponse:
    """Store the body as an upload of the caller's session; 201 with its reference."""
    try:
        if request.method not in METHODS:
            raise UploadHTTPError(405, ErrorCode.INVALID_PARAMS, "Use POST or PUT.")
        size = declared_length(request.META.get("CONTENT_LENGTH"))
        session_id = await sync_to_async(_session_of_caller)(request)
        body: Any = request  # an HttpRequest reads like a file
        stored = await sync_to_async(uploads.store, thread_sensitive=False)(
            session_id, body, size=size, mime_type=_mime_type(request)
        )
    except UploadHTTPError as refused:
        response = _error(refused.status, refused.error)
        if refused.status == 405:
            response["Allow"] = ", ".join(METHODS)
        return response
    except uploads.UploadRefused as refused:
        return _error(400, WireError(code=ErrorCode.INVALID_PARAMS, message=str(refused)))
    response = JsonResponse(stored.reference(), status=201)
    response["Cache-Control"] = "no-store"
    return response


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


def _session_of_caller(request: HttpRequest) -> str:
    """The session the upload is for, once the caller is known to hold it."""
    principal = _principal(request)
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


def _principal(request: HttpRequest) -> Principal:
    """Who is calling, by the WebSocket's own rules; UploadHTTPError (401) if nobody we know."""
    # The WebSocket's credential check reads an ASGI scope: the same headers, from here.
    scope = {
        "headers": [
            (name.encode("latin-1"), request.headers[name].encode("latin-1"))
            for name in ("Authorization", "Origin")
            if name in request.headers
        ],
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
    }
    try:
        return credentials.authenticate(scope)
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


def _error(status: int, error: WireError) -> JsonResponse:
    response = JsonResponse({"error": error.to_json()}, status=status)
    response["Cache-Control"] = "no-store"
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="abp"'
    return response
