"""Uploads: raw bytes a session stores once, then names in its calls instead of base64.

Our extension to ABP (docs/uploads.md). `POST /abp/uploads` (capabilities/web/uploads.py)
streams the body into Django's default storage as `uploads/<session id>/<expiry>-<random>`
and answers an `uploadId`. A call passes `{"uploadId": ...}` wherever a capability
takes BinaryData; the worker reads the bytes back from storage (jobs/inputs.py).

The id is the upload's claims (session, file, size, type, expiry) signed with the
SECRET_KEY, so no table is needed: a forged or altered id fails the signature, an id
of another session names that session and is refused, and an expired one says so.
Another principal cannot hold the session (the route checks the session is theirs),
so it cannot hold its uploads either. Retention (jobs/retention.py) deletes a file
once its expiry, written in its name, is past by longer than a call may wait.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, Protocol, cast

from django.core import signing
from django.core.files.base import File
from django.core.files.storage import default_storage

from capabilities.conf import abp_settings
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import registry
from capabilities.work.schemas import UPLOAD_REFERENCE_KEY

UPLOADS_DIR = "uploads"
# The key that makes a binary input a reference to an upload (the schemas' too).
REFERENCE_KEY = UPLOAD_REFERENCE_KEY
SALT = "capabilities.uploads"
DEFAULT_MIME_TYPE = "application/octet-stream"
CHUNK_BYTES = 256 * 1024
_FILE_NAME = re.compile(r"^(\d{1,12})-[0-9a-f]{32}$")


class UploadRefused(Exception):
    """An uploadId this call may not use; the message is for the agent."""


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


@dataclass(frozen=True, kw_only=True)
class Upload:
    """One stored upload, as its id describes it."""

    session_id: str
    name: str  # in the storage
    size: int
    mime_type: str
    expires_at: int  # Unix seconds

    def reference(self) -> dict[str, Any]:
        """What the route answers, and what a call may pass back as its binary input."""
        expires = datetime.fromtimestamp(self.expires_at, tz=UTC)
        return {
            REFERENCE_KEY: signing.Signer(salt=SALT).sign_object(
                {
                    "s": self.session_id,
                    "n": self.name.rsplit("/", 1)[1],
                    "z": self.size,
                    "m": self.mime_type,
                }
            ),
            "size": self.size,
            "mimeType": self.mime_type,
            "expiresAt": expires.isoformat().replace("+00:00", "Z"),
        }


def max_bytes() -> int:
    """The largest upload (ABP_MAX_UPLOAD_BYTES)."""
    return abp_settings().MAX_UPLOAD_BYTES


def folder(session_id: str) -> str:
    """Where a session's uploads are stored."""
    return f"{UPLOADS_DIR}/{uuid.UUID(session_id).hex}/"


def expiry_of(file_name: str) -> int | None:
    """The expiry (Unix seconds) written in an upload's file name; None if not one of ours."""
    match = _FILE_NAME.match(file_name)
    return int(match.group(1)) if match else None


def store(session_id: str, body: _Readable, *, size: int, mime_type: str) -> Upload:
    """Write `size` bytes of `body` to storage once, as an upload of the session."""
    expires_at = int(time.time()) + abp_settings().UPLOAD_TTL_SECONDS
    name = f"{folder(session_id)}{expires_at}-{secrets.token_hex(16)}"
    reader = _Exactly(body, size)
    stored = default_storage.save(name, File(cast(IO[bytes], reader), name=name))
    if reader.read_bytes != size:  # the client sent less than it announced
        default_storage.delete(stored)
        raise UploadRefused(f"The body ended after {reader.read_bytes} of {size} bytes.")
    return Upload(
        session_id=uuid.UUID(session_id).hex,
        name=stored,
        size=size,
        mime_type=mime_type,
        expires_at=expires_at,
    )


def resolve(upload_id: str, session_id: str, *, at: float | None = None) -> Upload:
    """The upload an id names, for a call of `session_id` made at `at` (default: now).

    UploadRefused if the id is forged, of another session, or expired by then. The
    same message for a forged id and another session's: neither tells what exists.
    """
    try:
        claims = signing.Signer(salt=SALT).unsign_object(upload_id)
        owner, file_name = str(claims["s"]), str(claims["n"])
        size, mime_type = int(claims["z"]), str(claims["m"])
    except (signing.BadSignature, ValueError, KeyError, TypeError):
        raise UploadRefused("This uploadId is not an upload of this session.") from None
    expires_at = expiry_of(file_name)
    if owner != uuid.UUID(session_id).hex or expires_at is None:
        raise UploadRefused("This uploadId is not an upload of this session.")
    if expires_at < (time.time() if at is None else at):
        raise UploadRefused("This upload has expired; upload the bytes again.")
    return Upload(
        session_id=owner,
        name=f"{UPLOADS_DIR}/{owner}/{file_name}",
        size=size,
        mime_type=mime_type,
        expires_at=expires_at,
    )


def references(params: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Each parameter passed as an upload reference, and its uploadId."""
    for key, value in params.items():
        if isinstance(value, dict) and isinstance(value.get(REFERENCE_KEY), str):
            yield key, value[REFERENCE_KEY]


def refusal(session_id: str, capability: str, params: dict[str, Any]) -> WireError | None:
    """INVALID_PARAMS for the first reference this call may not use; None if all are fine.

    For the call checks, after the schema: no I/O (the id says it all), so it costs
    nothing on calls without references.
    """
    for key, upload_id in references(params):
        path = f"params.{key}.{REFERENCE_KEY}"
        try:
            upload = resolve(upload_id, session_id)
        except UploadRefused as refused:
            message = str(refused)
            return WireError(code=ErrorCode.INVALID_PARAMS, message=message, details={"path": path})
        limit = _size_limit(capability, key)
        if limit is not None and upload.size > limit:
            return WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"'params.{key}' is larger than {limit} bytes.",
                details={"path": path, "limit": limit},
            )
    return None


def _size_limit(capability: str, key: str) -> int | None:
    """The capability's own limit on the bytes of a binary parameter, if it has one."""
    spec = registry.get(capability)
    for limit in spec.size_limits if spec is not None else ():
        if limit.base64 and limit.path == (key, "content"):
            return limit.max_bytes()
    return None


def read(upload: Upload) -> bytes:
    """The upload's bytes; FileNotFoundError if retention already took them."""
    with default_storage.open(upload.name, "rb") as handle:
        data: bytes = handle.read()
    return data


class _Exactly:
    """A request body read in chunks, never past the length it announced."""

    closed = False  # for django.core.files.File, which asks

    def __init__(self, body: _Readable, size: int) -> None:
        self._body = body
        self._left = size
        self.read_bytes = 0

    def read(self, size: int = -1, /) -> bytes:
        want = self._left if size < 0 else min(size, self._left)
        data = self._body.read(want) if want > 0 else b""
        self._left -= len(data)
        self.read_bytes += len(data)
        return data

    def seekable(self) -> bool:
        # Storages that rewind a seekable file (S3) must not try: a body is read once.
        return False
