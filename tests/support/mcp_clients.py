"""MCP clients for the tests: the official Python client, and raw HTTP on the 2025 wire."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

WIRE_VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


def suite_key() -> str:
    """The agent key every stack test connects with."""
    return os.environ["ABP_TEST_AGENT_KEY"]


@contextlib.asynccontextmanager
async def official_client(
    url: str, *, key: str | None = None, mode: str = "auto", **options: Any
) -> AsyncIterator[Client]:
    """`mcp.Client` on Streamable HTTP with an agent key."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key or suite_key()}"})
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, **options) as client:
            yield client


class RawSession:
    """One MCP session over raw HTTP (2025-11-25): every message the server sent, by stream."""

    def __init__(self, http: httpx2.AsyncClient, url: str, key: str) -> None:
        self.http = http
        self.url = url
        self.key = key
        self.session_id = ""

    def headers(self, **extra: str) -> dict[str, str]:
        found = {
            "Authorization": f"Bearer {self.key}",
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            "MCP-Protocol-Version": WIRE_VERSION,
        }
        if self.session_id:
            found["Mcp-Session-Id"] = self.session_id
        found.update(extra)
        return found

    async def open(self) -> None:
        """initialize, then notifications/initialized."""
        response = await self.http.post(
            self.url,
            headers=self.headers(),
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": WIRE_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "1"},
                },
            },
        )
        response.raise_for_status()
        self.session_id = response.headers["mcp-session-id"]
        await self.notify("notifications/initialized", {})

    async def notify(self, method: str, params: dict[str, Any]) -> httpx2.Response:
        """A notification: 202 when taken."""
        return await self.http.post(
            self.url,
            headers=self.headers(),
            json={"jsonrpc": "2.0", "method": method, "params": params},
        )

    @contextlib.asynccontextmanager
    async def request(
        self, request_id: int | str, method: str, params: dict[str, Any]
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """A request whose answer streams back as SSE: its messages, one by one."""
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        async with self.http.stream(
            "POST", self.url, headers=self.headers(), json=body
        ) as response:
            response.raise_for_status()
            yield events_of(response)

    async def close(self) -> httpx2.Response:
        """DELETE the session."""
        return await self.http.delete(self.url, headers=self.headers())


async def events_of(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE response, one by one."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []


MODERN_VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class RawModern:
    """Session-less requests over raw HTTP (2026-07-28): each one carries its own envelope.

    `tasks` declares the tasks extension (SEP-2663) in every request's capabilities.
    """

    def __init__(self, http: httpx2.AsyncClient, url: str, key: str, *, tasks: bool = True) -> None:
        self.http = http
        self.url = url
        self.key = key
        self.tasks = tasks
        self._ids = 0

    def body(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The request: `params` with the 2026 envelope in `_meta`."""
        extensions: dict[str, Any] = {TASKS_EXTENSION: {}} if self.tasks else {}
        meta = {
            **params.get("_meta", {}),
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
            "io.modelcontextprotocol/clientInfo": {"name": "raw-modern-test", "version": "1"},
        }
        self._ids += 1
        return {
            "jsonrpc": "2.0",
            "id": self._ids,
            "method": method,
            "params": {**params, "_meta": meta},
        }

    def headers(self, method: str, params: dict[str, Any], **extra: str) -> dict[str, str]:
        """Routing headers as SEP-2243 has them; `Mcp-Name` is the tool's name or the taskId."""
        found = {
            "Authorization": f"Bearer {self.key}",
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN_VERSION,
            "Mcp-Method": method,
        }
        name = params.get("name", params.get("taskId"))
        if isinstance(name, str):
            found["Mcp-Name"] = name
        found.update(extra)
        return found

    async def rpc(self, method: str, params: dict[str, Any], **headers: str) -> dict[str, Any]:
        """The one answer to a request (its `result` or its `error`); notifications skipped."""
        body = self.body(method, params)
        async with self.http.stream(
            "POST", self.url, headers=self.headers(method, params, **headers), json=body
        ) as response:
            if response.headers.get("content-type", "").startswith("application/json"):
                answer: dict[str, Any] = json.loads(await response.aread())
                return answer
            async for message in events_of(response):
                if message.get("id") == body["id"]:
                    return message
        raise AssertionError(f"no answer to {method} (HTTP {response.status_code})")
