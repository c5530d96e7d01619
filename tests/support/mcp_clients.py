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
            yield _events(response)

    async def close(self) -> httpx2.Response:
        """DELETE the session."""
        return await self.http.delete(self.url, headers=self.headers())


async def _events(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
