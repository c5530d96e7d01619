"""Hop by hop: client -> relay -> `/abp/rpc`, as in ACP's proxy chains.

The relay (tests/support/jsonrpc_relay.py) renumbers every request, so the server
never sees the client's ids: a client's `$/cancel_request` reaches it only as the
relay's own cancel of the relay's own id, and the -32800 must come back to the client
under the client's id.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from capabilities.models import CancelSource, Job, JobStatus
from tests.support.jsonrpc_relay import JSONRPCRelay
from tests.support.rpc_agent import rpc_url
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("database")

Message = dict[str, Any]
LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}  # a minute, unless cancelled


class Peer:
    """A JSON-RPC client on a plain WebSocket, keeping every message it received."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: list[Message] = []

    def send(self, message: Message) -> None:
        self.ws.send(json.dumps({"jsonrpc": "2.0", **message}))

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 15.0) -> Message:
        """The first message, already received or still to come, that matches."""
        for seen in self.inbox:
            if predicate(seen):
                return seen
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.01, deadline - time.monotonic())
            message: Message = json.loads(self.ws.recv(timeout=left))
            self.inbox.append(message)
            if predicate(message):
                return message

    def response(self, request_id: Any, timeout: float = 15.0) -> Message:
        return self.wait_for(lambda m: "method" not in m and m.get("id") == request_id, timeout)

    def request(self, request_id: Any, method: str, params: Message) -> Message:
        self.send({"id": request_id, "method": method, "params": params})
        return self.response(request_id)

    def drain(self, seconds: float) -> None:
        """Read whatever else arrives within `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.inbox.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return

    def responses_to(self, request_id: Any) -> list[Message]:
        return [m for m in self.inbox if "method" not in m and m.get("id") == request_id]


@pytest.fixture
def relay(stack: Stack) -> Iterator[JSONRPCRelay]:
    with JSONRPCRelay(rpc_url(stack.ws_url)) as running:
        yield running
    assert running.errors == []


@pytest.fixture
def peer(relay: JSONRPCRelay) -> Iterator[Peer]:
    with connect(relay.url, max_size=None) as ws:
        yield Peer(ws)


def initialize(peer: Peer) -> str:
    """Initialize through the relay; the session's id."""
    reply = peer.request("client-init", "initialize", {"protocolVersion": 1})
    assert "result" in reply, reply
    session_id: str = reply["result"]["_meta"]["abp/sessionId"]
    return session_id


def job_of(session_id: str, call_id: str) -> Job | None:
    return Job.objects.filter(session_id=uuid.UUID(session_id), call_id=call_id).first()


def stopped_job(session_id: str, call_id: str) -> Job | None:
    job = job_of(session_id, call_id)
    return job if job is not None and job.stopped_at is not None else None


def test_a_cancel_at_the_client_hops_through_the_relay_and_stops_the_job(
    stack: Stack, relay: JSONRPCRelay, peer: Peer
) -> None:
    session_id = initialize(peer)
    call_id = f"relayed-{uuid.uuid4().hex[:8]}"
    peer.send(
        {
            "id": "client-call-7",
            "method": "_abp/call",
            "params": {
                "capability": "test.sleep",
                "params": LONG,
                "callId": call_id,
                "_meta": {"progressToken": "client-token"},
            },
        }
    )
    progress = peer.wait_for(lambda m: m.get("method") == "_abp/progress")
    # Notifications pass through untouched: the token is the client's.
    assert progress["params"]["progressToken"] == "client-token"
    assert progress["params"]["callId"] == call_id
    cancelled_at = time.time()
    peer.send({"method": "$/cancel_request", "params": {"requestId": "client-call-7"}})

    reply = peer.response("client-call-7")
    assert "result" not in reply, reply
    assert reply["error"]["code"] == -32800, reply
    assert reply["error"]["data"]["code"] == "CANCELLED", reply
    peer.drain(0.5)
    assert len(peer.responses_to("client-call-7")) == 1  # answered once

    # The server saw only the relay's ids, and the relay's own cancel of its own id.
    (upstream_call,) = [m for m in relay.sent_upstream if m.get("method") == "_abp/call"]
    (upstream_cancel,) = [m for m in relay.sent_upstream if m.get("method") == "$/cancel_request"]
    assert upstream_call["id"] != "client-call-7"
    assert upstream_cancel == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": upstream_call["id"]},
    }

    job = eventually(lambda: stopped_job(session_id, call_id), timeout=10)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.stopped_at is not None
    assert job.stopped_at.timestamp() - cancelled_at < 2.0
    eventually(lambda: f"Job {job.id} stopped on cancel" in stack.worker.log_text())


def test_calls_in_flight_together_come_back_under_the_clients_own_ids(
    relay: JSONRPCRelay, peer: Peer
) -> None:
    session_id = initialize(peer)
    # The client's ids are numbers too, in the order opposite to the relay's counter.
    for client_id, steps in ((2, 6), (1, 1)):
        peer.send(
            {
                "id": client_id,
                "method": "_abp/call",
                "params": {
                    "capability": "test.sleep",
                    "params": {"steps": steps, "stepMs": 10, "echo": f"for {client_id}"},
                    "callId": f"pair-{session_id[:8]}-{client_id}",
                },
            }
        )
    for client_id in (1, 2):
        reply = peer.response(client_id)
        assert reply["result"]["data"]["echo"] == f"for {client_id}", reply
        assert reply["result"]["callId"] == f"pair-{session_id[:8]}-{client_id}"
    upstream_ids = [m["id"] for m in relay.sent_upstream if m.get("method") == "_abp/call"]
    assert len(set(upstream_ids)) == 2
    # "1" is not 1: a string id of the client's own is its own request.
    listed = peer.request("1", "_abp/capabilities/list", {})
    assert "test.sleep" in {c["name"] for c in listed["result"]["capabilities"]}


def test_a_cancel_of_a_request_the_hop_does_not_hold_goes_no_further(
    relay: JSONRPCRelay, peer: Peer
) -> None:
    initialize(peer)
    reply = peer.request(
        "quick",
        "_abp/call",
        {"capability": "convert.markdownToHtml", "params": {"markdown": "# Hop"}},
    )
    assert reply["result"]["data"] == {"html": "<h1>Hop</h1>"}
    # Finished, and never sent: neither has an upstream id to cancel.
    peer.send({"method": "$/cancel_request", "params": {"requestId": "quick"}})
    peer.send({"method": "$/cancel_request", "params": {"requestId": "never-sent"}})
    peer.drain(0.3)
    assert not [m for m in relay.sent_upstream if m.get("method") == "$/cancel_request"]
    assert len(peer.responses_to("quick")) == 1


def test_an_abp_cancel_through_the_relay_is_confirmed_then_the_call_is_cancelled(
    relay: JSONRPCRelay, peer: Peer
) -> None:
    session_id = initialize(peer)
    call_id = f"relayed-{uuid.uuid4().hex[:8]}"
    peer.send(
        {
            "id": "long",
            "method": "_abp/call",
            "params": {
                "capability": "test.sleep",
                "params": LONG,
                "callId": call_id,
                "_meta": {"progressToken": 7},
            },
        }
    )
    peer.wait_for(lambda m: m.get("method") == "_abp/progress")
    confirmed = peer.request("stop-it", "_abp/cancel", {"callId": call_id, "reason": "hop"})
    assert confirmed["result"]["callId"] == call_id
    assert confirmed["result"]["cancelled"] is True
    reply = peer.response("long")
    assert reply["error"]["code"] == -32800, reply
    assert reply["error"]["data"]["code"] == "CANCELLED"
    # The confirmation came first, then the call's own -32800.
    assert peer.inbox.index(confirmed) < peer.inbox.index(reply)
    job = eventually(lambda: stopped_job(session_id, call_id), timeout=10)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)
