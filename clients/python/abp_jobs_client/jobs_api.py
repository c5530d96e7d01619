"""The "Your jobs" API over HTTP: list the key owner's jobs, cancel one.

Beside the WebSocket the client already uses (`.../abp/ws` -> `.../abp/jobs.json`),
with the same agent key as `Authorization: Bearer`. Blocking stdlib `urllib`: no
extra dependency. The server's coded errors come back as `ABPError`s.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

from abp_jobs_client.errors import ABPError

TIMEOUT_SECONDS = 30


def api_url(ws_url: str, route: str) -> str:
    """An API route beside a WebSocket URL, as the uploads' (transfers.uploads_url).

    `wss://h/abp/ws` and "jobs.json" give `https://h/abp/jobs.json`.
    """
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    prefix = path[: -len("/ws")] if path.endswith("/ws") else "/abp"
    return f"{scheme}://{parts.netloc}{prefix}/{route}"


def list_jobs(
    ws_url: str, key: str | None, *, status: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """A page of the key owner's jobs, newest first: `{jobs, nextCursor, next}`."""
    query = {name: str(value) for name, value in (("status", status), ("limit", limit)) if value}
    url = api_url(ws_url, "jobs.json")
    if query:
        url = f"{url}?{urllib.parse.urlencode(query)}"
    return _call(urllib.request.Request(url, headers=_headers(key)))


def cancel_job(ws_url: str, key: str | None, job_id: uuid.UUID, reason: str = "") -> dict[str, Any]:
    """Cancel one of the key owner's jobs: `{id, cancelled, status}`."""
    body = json.dumps({"reason": reason}).encode()
    request = urllib.request.Request(
        api_url(ws_url, f"jobs/{job_id}/cancel"),
        data=body,
        headers={**_headers(key), "Content-Type": "application/json"},
        method="POST",
    )
    return _call(request)


def _headers(key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _call(request: urllib.request.Request) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as refused:
        try:
            error = json.loads(refused.read())["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if not isinstance(error, dict):
            error = {
                "code": "TRANSPORT_ERROR",
                "message": f"HTTP {refused.code} from {refused.url}",
            }
        raise ABPError.from_wire(error) from None
    except urllib.error.URLError as failed:
        raise ABPError("TRANSPORT_ERROR", str(failed.reason), retryable=True) from None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        message = f"{request.full_url} did not answer with a JSON object: is it abp-jobs?"
        raise ABPError("TRANSPORT_ERROR", message)
    return answer
