"""Serving result files named by signed download links (capabilities/jobs/download_links.py).

A tampered token, or another session's, is 403; an expired one, or a result past
its retention, 410; another file name 404. Those checks are ours, always, before
anything is served. Then, by default, the file is streamed from the storage (the
filesystem or an S3 bucket) through this process, in chunks read off the event
loop. With ABP_DOWNLOAD_REDIRECT and a store that signs URLs (S3 and compatibles),
the answer is instead a 302 to the store's own signed URL, with the headers we
would have sent, that expires within ABP_DOWNLOAD_REDIRECT_SECONDS and never after
the link or the retention (docs/operating.md#storage).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.core.files.storage import Storage, storages
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.utils import timezone
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from capabilities.conf import storage_settings
from capabilities.jobs import download_links

CHUNK_BYTES = 256 * 1024
NO_STORE = "private, no-store"


@require_GET
async def download(request: HttpRequest, token: str, filename: str) -> HttpResponseBase:
    """Serve a result file named by a valid, unexpired token of its own session."""
    try:
        link = await sync_to_async(download_links.resolve)(token, filename)
    except download_links.Refused as refused:
        return _plain(refused.message, refused.status)
    storage = storages["default"]
    if storage_settings().DOWNLOAD_REDIRECT and signs_urls(storage):
        return await sync_to_async(_redirect, thread_sensitive=False)(storage, link)
    try:
        opened = await sync_to_async(_open, thread_sensitive=False)(storage, link.name)
    except FileNotFoundError:
        return _plain(download_links.GONE, 410)
    response = StreamingHttpResponse(opened, content_type=link.mime_type)
    response["Content-Length"] = str(opened.size)
    response["Content-Disposition"] = _attachment(link.filename)
    response["Cache-Control"] = NO_STORE
    return response


def _plain(message: str, status: int) -> HttpResponse:
    response = HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = NO_STORE
    return response


def _attachment(filename: str) -> str:
    header = content_disposition_header(True, filename)
    assert header is not None  # always, for an attachment
    return header


def _s3_backend() -> Any:
    """django-storages' S3 module if a storage of it was made, else None.

    Looked up, not imported: a process on the filesystem never loads boto3.
    """
    return sys.modules.get("storages.backends.s3")


def signs_urls(storage: Storage) -> bool:
    """Whether the storage hands out signed, expiring URLs of private objects.

    S3Storage does unless it is set to unsigned URLs or to a custom domain (whose
    URLs django-storages leaves unsigned). The filesystem does not.
    """
    s3 = _s3_backend()
    return (
        s3 is not None
        and isinstance(storage, s3.S3Storage)
        and bool(getattr(storage, "querystring_auth", False))
        and not getattr(storage, "custom_domain", None)
    )


def _redirect(storage: Any, link: download_links.Link) -> HttpResponseBase:
    """A 302 to the store's signed URL of the file; 410 if it is no longer there."""
    if not storage.exists(link.name):
        return _plain(download_links.GONE, 410)
    left = (link.valid_until - timezone.now()) // timedelta(seconds=1)
    seconds = max(1, min(storage_settings().DOWNLOAD_REDIRECT_SECONDS, left))
    url = storage.url(
        link.name,
        parameters={
            "ResponseContentType": link.mime_type,
            "ResponseContentDisposition": _attachment(link.filename),
            "ResponseCacheControl": NO_STORE,
        },
        expire=seconds,
    )
    response = HttpResponseRedirect(url)
    response["Cache-Control"] = NO_STORE
    return response


class _Reader(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


class StoredFile:
    """A stored file, read in chunks in a worker thread as Daphne sends them.

    An async iterator, so Django streams it as it goes instead of reading the whole
    file into memory first (what it does with a FileResponse under ASGI).
    """

    def __init__(self, reader: _Reader, size: int, *closers: _Reader) -> None:
        self._reader = reader
        self.size = size
        self._closers = (reader, *closers)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        read = sync_to_async(self._reader.read, thread_sensitive=False)
        while chunk := await read(CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        """Release the file (Django calls it when the response is done)."""
        for closer in self._closers:
            closer.close()


def _open(storage: Storage, name: str) -> StoredFile:
    """The stored file, ready to stream; FileNotFoundError if it is gone."""
    handle: Any = storage.open(name, "rb")
    s3 = _s3_backend()
    if s3 is not None and isinstance(handle, s3.S3File):
        # The object's body as it arrives, not S3File's copy of the whole object
        # (its open() already asked for the object's size: one HEAD, then one GET).
        return StoredFile(handle.obj.get()["Body"], int(handle.size), handle)
    return StoredFile(handle, int(handle.size))
