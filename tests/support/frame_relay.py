"""A WebSocket relay on loopback that loses one call frame as its socket drops.

The relay forwards frames both ways between a client and the app. Told to lose a
callId, it swallows that call's frame (the client sent it; the app never gets it)
and cuts both connections without a close frame, as a network that fails mid-send
would. Every later connection is relayed faithfully: the client resumes through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

# What a client's handshake carries that the app reads: its credential and origin.
FORWARDED_HEADERS = ("Authorization", "Origin")


class FrameRelay:
    """Relays ws://127.0.0.1:<port>/... to `upstream`, on a thread, until closed."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream.rstrip("/")
        self._lose: str | None = None
        self.lost: list[str] = []
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._run, name="frame-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")

    @property
    def url(self) -> str:
        """The upstream's URL, through the relay."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        path = self._upstream.split("/", 3)[3] if self._upstream.count("/") >= 3 else ""
        return f"ws://127.0.0.1:{port}/{path}"

    def lose_call(self, call_id: str) -> None:
        """Swallow the next call frame with this callId, then drop the connection."""
        self._lose = call_id

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(self._serve())
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self) -> Server:
        return await serve(self._relay, "127.0.0.1", 0, max_size=None)

    async def _relay(self, client: ServerConnection) -> None:
        self.connections += 1
        headers = {
            name: value
            for name in FORWARDED_HEADERS
            if (value := client.request.headers.get(name)) is not None  # type: ignore[union-attr]
        }
        try:
            upstream = await connect(self._upstream, additional_headers=headers, max_size=None)
        except OSError:
            client.transport.abort()
            return
        outward = asyncio.ensure_future(self._pump(client, upstream, outward=True))
        inward = asyncio.ensure_future(self._pump(upstream, client, outward=False))
        await asyncio.wait({outward, inward}, return_when=asyncio.FIRST_COMPLETED)
        for task in (outward, inward):
            task.cancel()
        for end in (client, upstream):
            end.transport.abort()

    async def _pump(
        self, source: ServerConnection | ClientConnection, sink: Any, *, outward: bool
    ) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for frame in source:
                if outward and self._loses(frame):
                    return  # swallowed: the caller cuts both connections
                await sink.send(frame)

    def _loses(self, frame: str | bytes) -> bool:
        if self._lose is None:
            return False
        try:
            message = json.loads(frame)
            payload = message["payload"]
            call_id = (payload.get("options") or {}).get("callId") or payload.get("callId")
        except (ValueError, TypeError, KeyError, AttributeError):
            return False
        if message.get("type") != "capabilities/call" or call_id != self._lose:
            return False
        self._lose = None
        self.lost.append(call_id)
        return True
