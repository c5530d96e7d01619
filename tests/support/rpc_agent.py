"""A minimal JSON-RPC 2.0 client of the `/abp/rpc` door over a real WebSocket."""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.support.agent import DEFAULT_KEY

Message = dict[str, Any]
RequestId = str | int | float


def rpc_url(ws_url: str) -> str:
    """The JSON-RPC door beside the ABP one (`.../abp/ws` -> `.../abp/rpc`)."""
    base, _, _ = ws_url.rpartition("/abp/ws")
    return f"{base}/abp/rpc"


def same_id(left: object, right: object) -> bool:
    """Ids equal as JSON values: `7`, `7.0`, `"7"` and `true` are all different."""
    return type(left) is type(right) and left == right


def is_response(message: Message) -> bool:
    """A response (to a request), not a notification or a request of the server."""
    return "method" not in message and ("result" in message or "error" in message)


class RpcAgent:
    """Sends requests and notifications, keeps every message, waits for the ones asked for."""

    def __init__(self, url: str, *, key: str | None = DEFAULT_KEY, **connect_kwargs: Any) -> None:
        """Connect, with the suite's agent key unless `key` says otherwise (None: none)."""
        if key is DEFAULT_KEY:
            key = os.environ["ABP_TEST_AGENT_KEY"]
        headers = dict(connect_kwargs.pop("additional_headers", None) or {})
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.ws: ClientConnection = connect(
            url, max_size=None, legacy=True, additional_headers=headers, **connect_kwargs
        )
        self.inbox: list[Message] = []
        # Indexes in the inbox already handed out by wait_for (each message once).
        self._taken: set[int] = set()
        self._ids = itertools.count(1)
        self.session_id: uuid.UUID | None = None
        self.resume_token: str | None = None

    def close(self) -> None:
        """Close the socket."""
        self.ws.close()

    def __enter__(self) -> RpcAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending --------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Send one JSON value as a text frame."""
        self.ws.send(json.dumps(message))

    def send_raw(self, text: str | bytes) -> None:
        """Send a frame as is."""
        self.ws.send(text)

    def request(
        self, method: str, params: dict[str, Any] | None = None, request_id: Any = None
    ) -> Any:
        """Send a request; returns its id (a fresh integer unless given)."""
        if request_id is None:
            request_id = next(self._ids) + 1000  # clear of the small ids tests pick
        message: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return request_id

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification (no id: never answered)."""
        message: Message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def call(
        self,
        capability: str,
        params: dict[str, Any] | None = None,
        *,
        call_id: str | None = None,
        timeout_ms: Any = None,
        progress_token: str | None = None,
        request_id: Any = None,
    ) -> Any:
        """Send `_abp/call`; returns the request id (its response echoes it)."""
        body: dict[str, Any] = {"capability": capability}
        if params is not None:
            body["params"] = params
        if call_id is not None:
            body["callId"] = call_id
        if timeout_ms is not None:
            body["timeout"] = timeout_ms
        if progress_token is not None:
            body["_meta"] = {"progressToken": progress_token}
        return self.request("_abp/call", body, request_id)

    def cancel(self, call_id: str, reason: str | None = None) -> Any:
        """Send `_abp/cancel`; returns the request id."""
        body: dict[str, Any] = {"callId": call_id}
        if reason is not None:
            body["reason"] = reason
        return self.request("_abp/cancel", body)

    def cancel_request(self, request_id: Any) -> None:
        """Send ACP's `$/cancel_request` notification for one of this connection's ids."""
        self.notify("$/cancel_request", {"requestId": request_id})

    # -- receiving ------------------------------------------------------------------------

    def receive_text(self, timeout: float = 10.0) -> str:
        """The next frame as sent (a text frame), its message kept in the inbox."""
        text = self.ws.recv(timeout=timeout)
        assert isinstance(text, str), f"a binary frame: {text[:100]!r}"
        self.inbox.append(json.loads(text))
        return text

    def receive(self, timeout: float = 10.0) -> Message:
        """The next message (kept in the inbox too)."""
        self.receive_text(timeout)
        message: Message = self.inbox[-1]
        return message

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 10.0) -> Message:
        """The first message not yet handed out, already received or still to come, that matches."""
        for index, message in enumerate(self.inbox):
            if index not in self._taken and predicate(message):
                self._taken.add(index)
                return message
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching message in {timeout}s; inbox: {self.inbox[-10:]}")
            message = self.receive(remaining)
            if predicate(message):
                self._taken.add(len(self.inbox) - 1)
                return message

    def response(self, request_id: Any, timeout: float = 20.0) -> Message:
        """The response to a request id (compared as a JSON value)."""
        return self.wait_for(lambda m: is_response(m) and same_id(m.get("id"), request_id), timeout)

    def result(self, request_id: Any, timeout: float = 20.0) -> Any:
        """The result of a request, failing with the whole response if it is an error."""
        response = self.response(request_id, timeout)
        assert "result" in response, response
        return response["result"]

    def notification(self, method: str, timeout: float = 10.0) -> Message:
        """The next notification of a method."""
        return self.wait_for(lambda m: m.get("method") == method and "id" not in m, timeout)

    def drain(self, quiet: float = 0.5) -> list[Message]:
        """Read until nothing arrives for `quiet` s; the messages read."""
        start = len(self.inbox)
        try:
            while True:
                self.receive(timeout=quiet)
        except TimeoutError:
            pass
        return self.inbox[start:]

    def read_until_closed(self, timeout: float = 10.0) -> int | None:
        """Read (into the inbox) until the server closes the socket; its close code."""
        try:
            while True:
                self.receive(timeout=timeout)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None

    def responses_to(self, request_id: Any) -> list[Message]:
        """Every response received so far for a request id."""
        return [m for m in self.inbox if is_response(m) and same_id(m.get("id"), request_id)]

    def notifications(self, method: str) -> list[Message]:
        """Every notification of a method received so far."""
        return [m for m in self.inbox if m.get("method") == method and "id" not in m]

    # -- session --------------------------------------------------------------------------

    def initialize(
        self,
        *,
        notifications: bool | None = None,
        resume: tuple[uuid.UUID | str, str] | None = None,
        awaiting: list[str] | None = None,
        request_id: Any = None,
    ) -> Message:
        """Send `initialize` (optionally resuming) and return its whole response."""
        meta: dict[str, Any] = {}
        if notifications is not None:
            meta["abp/notifications"] = notifications
        if resume is not None:
            meta["abp/resume"] = {"sessionId": str(resume[0]), "token": resume[1]}
            if awaiting is not None:
                meta["abp/resume"]["awaiting"] = awaiting
        params: dict[str, Any] = {
            "protocolVersion": 1,
            "clientInfo": {"name": "rpc-test-agent", "version": "1.0"},
        }
        if meta:
            params["_meta"] = meta
        response = self.response(self.request("initialize", params, request_id))
        if "result" in response:
            session_meta = response["result"]["_meta"]
            self.session_id = uuid.UUID(session_meta["abp/sessionId"])
            self.resume_token = session_meta["abp/resumeToken"]
        return response

    def start(self, **kwargs: Any) -> Message:
        """`initialize`, failing unless it succeeded; its result."""
        response = self.initialize(**kwargs)
        assert "result" in response, response
        result: Message = response["result"]
        return result
