"""A tiny JSON-RPC relay in front of `/abp/rpc`, hopping as ACP's proxy chains do.

Per client connection it opens its own upstream connection (with the suite's key),
sends each request upstream under an id of its own, maps the response back to the
client's id, and forwards notifications both ways. A client's `$/cancel_request`
becomes the relay's own `$/cancel_request` for the upstream id: a cancel belongs to
its hop and is never tunneled raw.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

Message = dict[str, Any]
CANCEL_REQUEST = "$/cancel_request"


def auth_headers(key: str | None = None) -> dict[str, str]:
    """The Authorization header for `key`, by default the suite's agent key."""
    return {"Authorization": f"Bearer {key or os.environ['ABP_TEST_AGENT_KEY']}"}


def _id_key(request_id: Any) -> str:
    # 1 and "1" are different ids; JSON text tells them apart.
    return json.dumps(request_id, sort_keys=True)


class Hop:
    """One client connection and the relay's own upstream connection for it."""

    def __init__(
        self, client: ServerConnection, upstream: ClientConnection, relay: JSONRPCRelay
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.relay = relay
        self.numbers = itertools.count(1)
        self.upstream_of: dict[str, int] = {}  # the client's id (as JSON) -> our id
        self.client_of: dict[int, Any] = {}  # our id -> the client's id

    async def run(self) -> None:
        """Relay both ways until either side closes, then close the other."""
        tasks = [
            asyncio.create_task(self.downstream_to_upstream()),
            asyncio.create_task(self.upstream_to_downstream()),
        ]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()
        # The upstream's close (a shutdown's 1000, a refused key's code) reaches the client;
        # the codes no endpoint may send (no status, abnormal) do not.
        code = self.upstream.close_code
        if code is None or code in (1005, 1006, 1015):
            code = 1011 if code == 1006 else 1000
        await self.client.close(code)

    async def downstream_to_upstream(self) -> None:
        try:
            async for frame in self.client:
                if isinstance(frame, str):
                    await self.from_client(frame)
        except ConnectionClosed:
            pass

    async def upstream_to_downstream(self) -> None:
        try:
            async for frame in self.upstream:
                if isinstance(frame, str):
                    await self.from_upstream(frame)
        except ConnectionClosed:
            pass

    async def from_client(self, frame: str) -> None:
        try:
            message = json.loads(frame)
        except ValueError:
            await self.send_upstream_raw(frame)  # not ours to judge: the server answers it
            return
        if not isinstance(message, dict) or "method" not in message:
            await self.send_upstream_raw(frame)
        elif "id" in message:
            ours = next(self.numbers)
            self.upstream_of[_id_key(message["id"])] = ours
            self.client_of[ours] = message["id"]
            await self.send_upstream({**message, "id": ours})
        elif message["method"] == CANCEL_REQUEST:
            params = message.get("params")
            named = params.get("requestId") if isinstance(params, dict) else None
            ours_named = self.upstream_of.get(_id_key(named))
            # A request this hop no longer has in flight has nothing to cancel upstream.
            if ours_named is not None:
                await self.send_upstream(
                    {
                        "jsonrpc": "2.0",
                        "method": CANCEL_REQUEST,
                        "params": {"requestId": ours_named},
                    }
                )
        else:
            await self.send_upstream(message)

    async def from_upstream(self, frame: str) -> None:
        message = json.loads(frame)
        is_response = isinstance(message, dict) and "method" not in message
        ours = message.get("id") if is_response else None
        if isinstance(ours, int) and not isinstance(ours, bool) and ours in self.client_of:
            theirs = self.client_of.pop(ours)
            self.upstream_of.pop(_id_key(theirs), None)
            message = {**message, "id": theirs}
        await self.client.send(json.dumps(message))

    async def send_upstream(self, message: Message) -> None:
        self.relay.sent_upstream.append(message)
        await self.upstream.send(json.dumps(message))

    async def send_upstream_raw(self, frame: str) -> None:
        self.relay.sent_upstream_raw.append(frame)
        await self.upstream.send(frame)


class JSONRPCRelay:
    """The relay, served from a thread of its own on a free port while in `with`."""

    def __init__(self, upstream_url: str, headers: dict[str, str] | None = None) -> None:
        self.upstream_url = upstream_url
        self.headers = headers if headers is not None else auth_headers()
        self.sent_upstream: list[Message] = []  # every message the relay sent upstream
        self.sent_upstream_raw: list[str] = []  # frames passed on as they came
        self.errors: list[BaseException] = []  # anything that went wrong inside the relay
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="jsonrpc-relay", daemon=True)

    @property
    def url(self) -> str:
        """Where clients connect (no key needed: the relay holds it)."""
        return f"ws://127.0.0.1:{self.port}/"

    def __enter__(self) -> JSONRPCRelay:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError(f"the relay did not start: {self.errors}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported through `errors`, read by the test
            self.errors.append(error)
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._handle, "127.0.0.1", 0, max_size=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _handle(self, client: ServerConnection) -> None:
        try:
            async with connect(
                self.upstream_url, additional_headers=self.headers, max_size=None
            ) as upstream:
                await Hop(client, upstream, self).run()
        except Exception as error:
            self.errors.append(error)
            raise
