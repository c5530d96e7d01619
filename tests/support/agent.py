"""A minimal ABP agent over a real WebSocket, for the integration tests."""

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

Envelope = dict[str, Any]

# Stands for "the suite's own key" (tests/support/environment.py creates it).
DEFAULT_KEY = "<the suite's key>"


def envelope(message_type: str, message_id: str, payload: dict[str, Any]) -> str:
    """One ABP envelope as a text frame."""
    return json.dumps(
        {
            "type": message_type,
            "id": message_id,
            "timestamp": int(time.time() * 1000),
            "payload": payload,
        }
    )


class Agent:
    """Sends envelopes, keeps every message received, waits for the ones asked for."""

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
        self.inbox: list[Envelope] = []
        self._ids = itertools.count(1)
        self._session_id: str | None = None
        self.resume_token: str | None = None

    def close(self) -> None:
        """Close the socket."""
        self.ws.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_id(self) -> str:
        """A fresh envelope id."""
        return f"m{next(self._ids)}"

    def send(
        self, message_type: str, payload: dict[str, Any], message_id: str | None = None
    ) -> str:
        """Send one envelope; returns its id."""
        message_id = message_id or self.next_id()
        self.ws.send(envelope(message_type, message_id, payload))
        return message_id

    def send_raw(self, text: str | bytes) -> None:
        """Send a frame as is."""
        self.ws.send(text)

    def receive(self, timeout: float = 10.0) -> Envelope:
        """The next message (kept in the inbox too)."""
        envelope: Envelope = json.loads(self.ws.recv(timeout=timeout))
        self.inbox.append(envelope)
        return envelope

    def wait_for(self, predicate: Callable[[Envelope], bool], timeout: float = 10.0) -> Envelope:
        """The first message, already received or still to come, that matches."""
        for envelope in self.inbox:
            if predicate(envelope) and not envelope.get("_taken"):
                envelope["_taken"] = True
                return envelope
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching message in {timeout}s; inbox: {self.inbox[-10:]}")
            envelope = self.receive(remaining)
            if predicate(envelope):
                envelope["_taken"] = True
                return envelope

    def read_until_closed(self, timeout: float = 5.0) -> int | None:
        """Read (into the inbox) until the server closes the socket; its close code."""
        try:
            while True:
                self.receive(timeout=timeout)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None

    def reply_to(self, message_id: str, message_type: str, timeout: float = 10.0) -> Envelope:
        """The reply of a type to a request id."""
        return self.wait_for(lambda e: e["type"] == message_type and e["id"] == message_id, timeout)

    def initialize(self, *, notifications: bool = False, name: str = "test-agent") -> Envelope:
        """initialize, and wait for initialize-result."""
        message_id = self.send(
            "initialize",
            {
                "agent": {"name": name, "version": "1.0"},
                "protocolVersion": "0.1",
                "features": {"notifications": notifications, "progress": True},
            },
        )
        reply = self.reply_to(message_id, "initialize-result")
        self._session_id = reply["payload"].get("sessionId")
        self.resume_token = reply["payload"].get("resumeToken")
        return reply

    def resume(
        self,
        session_id: uuid.UUID | str,
        token: str,
        *,
        notifications: bool = False,
        awaiting: list[str] | None = None,
    ) -> Envelope:
        """initialize with `resume`; the initialize-result (its payload may be an error)."""
        resume: dict[str, Any] = {"sessionId": str(session_id), "token": token}
        if awaiting is not None:
            resume["awaiting"] = awaiting
        message_id = self.send(
            "initialize",
            {
                "agent": {"name": "test-agent", "version": "1.0"},
                "protocolVersion": "0.1",
                "features": {"notifications": notifications, "progress": True},
                "resume": resume,
            },
        )
        reply = self.reply_to(message_id, "initialize-result")
        if "error" not in reply["payload"]:
            self._session_id = reply["payload"]["sessionId"]
            self.resume_token = reply["payload"]["resumeToken"]
        return reply

    @property
    def session_id(self) -> uuid.UUID:
        """The session this agent initialized."""
        if self._session_id is None:
            raise RuntimeError("not initialized")
        return uuid.UUID(self._session_id)

    def call(
        self,
        capability: str,
        params: dict[str, Any],
        *,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        progress_token: str | None = None,
        resent: bool = False,
        message_id: str | None = None,
    ) -> str:
        """Send capabilities/call; returns the envelope id (the call-result echoes it)."""
        options: dict[str, Any] = {}
        if call_id is not None:
            options["callId"] = call_id
        if resent:
            options["resent"] = True
        if timeout_ms is not None:
            options["timeout"] = timeout_ms
        if progress_token is not None:
            options["progressToken"] = progress_token
        return self.send(
            "capabilities/call",
            {"capability": capability, "params": params, "options": options},
            message_id=message_id,
        )

    def cancel(self, call_id: str, reason: str | None = None) -> str:
        """Send capabilities/cancel; returns the envelope id."""
        payload: dict[str, Any] = {"callId": call_id}
        if reason is not None:
            payload["reason"] = reason
        return self.send("capabilities/cancel", payload)

    def result_of(self, call_message_id: str, timeout: float = 20.0) -> Envelope:
        """The call-result of a call."""
        return self.reply_to(call_message_id, "capabilities/call-result", timeout)

    def results_for_call(self, call_id: str) -> list[Envelope]:
        """Every call-result received for a callId (exactly one is expected)."""
        return [
            e
            for e in self.inbox
            if e["type"] == "capabilities/call-result" and e["payload"].get("callId") == call_id
        ]
