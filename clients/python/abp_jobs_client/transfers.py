"""The client's HTTP side: uploads of big inputs, and result files behind download URLs.

Blocking stdlib `urllib`, run in a thread by the asyncio client: no extra dependency.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from abp_jobs_client.errors import ABPError
from abp_jobs_client.messages import Blob


def uploads_url(ws_url: str) -> str:
    """The upload route beside a WebSocket URL (`.../abp/ws` -> `.../abp/uploads`)."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    prefix = path[: -len("/ws")] if path.endswith("/ws") else "/abp"
    return f"{scheme}://{parts.netloc}{prefix}/uploads"


def upload(url: str, key: str | None, session_id: str, blob: Blob) -> dict[str, Any]:
    """POST the bytes to the upload route; the reference to pass as the input."""
    headers = {"ABP-Session": session_id, "Content-Type": blob.mime_type}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=blob.content, headers=headers, method="POST")
    answer = _open(request)
    reference: dict[str, Any] = json.loads(answer)
    return reference


def download(url: str) -> bytes:
    """A result file (its URL carries its own signed token)."""
    return _open(urllib.request.Request(url))


def _open(request: urllib.request.Request) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as refused:
        try:
            error = json.loads(refused.read())["error"]
        except (ValueError, KeyError, TypeError):
            error = {"code": "TRANSPORT_ERROR", "message": f"HTTP {refused.code}"}
        raise ABPError.from_wire(error) from None
    except urllib.error.URLError as failed:
        raise ABPError("TRANSPORT_ERROR", str(failed.reason), retryable=True) from None
