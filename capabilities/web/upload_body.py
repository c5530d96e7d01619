"""A request's body, from its ASGI `http.request` messages, read as a file.

The upload route (uploads.py) hands it to the storage, which reads it a few chunks at a
time. Not joined first: one large allocation is megabytes of fresh pages for the
kernel to zero on first touch, for nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Message = Mapping[str, Any]  # as Django's ASGIHandler types them
Receive = Callable[[], Awaitable[Message]]


class ClientGone(Exception):
    """The client went away before the end of the body: nobody to answer."""


async def received(receive: Receive) -> Chunks:
    """The whole body (Daphne has it all by the time the application runs)."""
    chunks: deque[bytes] = deque()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return Chunks(chunks)


class Chunks:
    """A body's chunks read in order, each let go once read."""

    def __init__(self, chunks: deque[bytes]) -> None:
        self._chunks = chunks

    def read(self, size: int = -1, /) -> bytes:
        if size < 0:
            size = sum(len(chunk) for chunk in self._chunks)
        parts: list[bytes] = []
        while size > 0 and self._chunks:
            chunk = self._chunks.popleft()
            if len(chunk) > size:
                self._chunks.appendleft(chunk[size:])
                chunk = chunk[:size]
            parts.append(chunk)
            size -= len(chunk)
        return b"".join(parts)
