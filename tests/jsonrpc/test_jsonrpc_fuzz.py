"""Hypothesis-fuzzed JSON-RPC frames: the decoder alone, then the consumer in process.

The decoder (`capabilities.jsonrpc.codec.decode`) returns a typed message, None (a
notification to ignore) or raises ProtocolError, whatever it is given. The consumer
(`JSONRPCConsumer`, on Channels' WebsocketCommunicator and the in-memory layer)
never crashes on such frames, before or after initialize: each reply is a JSON-RPC
response with a result or an error from docs/jsonrpc.md's table, and a fresh
connection still initializes and lists capabilities afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from unittest import mock

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from capabilities.access import agent_keys
from capabilities.calls import availability
from capabilities.conf import abp_settings
from capabilities.jobs import workers
from capabilities.jsonrpc import codec
from capabilities.protocol import (
    CallRequest,
    CancelPendingRequest,
    CancelRequest,
    ErrorCode,
    Initialize,
    ListCapabilities,
    ProtocolError,
    Shutdown,
)
from capabilities.protocol.text import unstorable
from capabilities.transport.rpc_consumer import JSONRPCConsumer

Message = dict[str, Any]
IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
TIMEOUT = 5.0
MAX_ID_LENGTH = 200
DECODER = hypothesis_settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
CONSUMER = hypothesis_settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# docs/jsonrpc.md's error table: code -> (message, the ABP codes its data may carry).
# None: "any other failure".
TABLE: dict[int, tuple[str, set[str] | None]] = {
    -32700: ("Parse error", {"PARSE_ERROR"}),
    -32600: ("Invalid request", {"INVALID_REQUEST", "NOT_INITIALIZED", "ALREADY_INITIALIZED"}),
    -32601: ("Method not found", {"UNKNOWN_MESSAGE_TYPE"}),
    -32602: (
        "Invalid params",
        {"INVALID_PARAMS", "MISSING_PARAM", "INVALID_TYPE", "UNKNOWN_CAPABILITY"},
    ),
    -32603: ("Internal error", {"INTERNAL_ERROR"}),
    -32800: ("Request cancelled", {"CANCELLED", "TIMEOUT"}),
    -32000: ("Authentication required", {"PERMISSION_DENIED"}),
    -32002: ("Resource not found", {"SESSION_INVALID", "SESSION_EXPIRED"}),
    -32001: ("Call failed", None),
}
NAMED = set().union(*(codes for _, codes in TABLE.values() if codes is not None))
# What a frame alone can be refused with, by the decoder.
DECODER_CODES = {
    ErrorCode.PARSE_ERROR,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.UNKNOWN_MESSAGE_TYPE,
    ErrorCode.INVALID_PARAMS,
    ErrorCode.MISSING_PARAM,
    ErrorCode.INVALID_TYPE,
}
# Nothing a client sends makes these the right answer: a key it holds, no operator.
NEVER_FOR_A_FRAME = {-32603, -32000}
SERVER_NOTIFICATIONS = {
    "_abp/progress",
    "_abp/result",
    "_abp/operation/started",
    "_abp/operation/completed",
    "_abp/capabilities/changed",
}
MESSAGE_CLASSES = (
    Initialize,
    CallRequest,
    CancelRequest,
    Shutdown,
    ListCapabilities,
    CancelPendingRequest,
)


def same_id(left: object, right: object) -> bool:
    """Ids equal as JSON values: 7, 7.0, "7" and True are four different ones."""
    return type(left) is type(right) and left == right


def clean_id(value: object) -> bool:
    """An id the door must echo (docs/jsonrpc.md): a string of up to 200 characters with
    no NUL and no lone surrogate, or a number of up to 200 characters as JSON."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        return len(value) <= MAX_ID_LENGTH and unstorable(value) is None
    if isinstance(value, int | float):
        return math.isfinite(value) and len(json.dumps(value)) <= MAX_ID_LENGTH
    return False


def bad_id(value: object) -> bool:
    """An id the door refuses (-32600, answered with id null): anything not clean."""
    return not clean_id(value)


# -- strategies ------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=10), children, max_size=4),
    ),
    max_leaves=15,
)
METHODS = [
    "initialize",
    "_abp/capabilities/list",
    "_abp/call",
    "_abp/cancel",
    "_abp/shutdown",
    "$/cancel_request",
    "session/new",
    "capabilities/call",
    "_abp/nope",
]
KEYS = [
    "protocolVersion",
    "clientInfo",
    "_meta",
    "abp/resume",
    "abp/notifications",
    "sessionId",
    "token",
    "capability",
    "params",
    "callId",
    "timeout",
    "progressToken",
    "reason",
    "requestId",
    "markdown",
    "mode",
    "steps",
    "stepMs",
]
field_values = st.one_of(
    json_scalars,
    st.sampled_from(
        [
            "convert.markdownToHtml",
            "test.sleep",
            "export.docx",
            "c-1",
            "",
            "x" * 201,
            "a\x00b",
            "\ud800",
            0,
            -1,
            1,
            0.5,
            10**400,
            True,
            "# Hi",
            "checkpoint",
        ]
    ),
)
nested = st.recursive(
    field_values,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from(KEYS), children, max_size=5)
    ),
    max_leaves=12,
)
params_values = st.one_of(st.dictionaries(st.sampled_from(KEYS), nested, max_size=5), json_values)
ids = st.one_of(
    st.text(min_size=1, max_size=12),
    # Near the 200-character bound, and text whose JSON escapes are longer than it.
    st.text(min_size=190, max_size=201),
    st.text(alphabet="éß日本\u2028", min_size=30, max_size=80),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.sampled_from([0, 1.5, -0.25, 1e10, 10**49, "", "x" * 200, "x" * 201, "a\x00", None, True]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
ABSENT = object()


@st.composite
def near_valid(draw: st.DrawFn) -> Message:
    """A request or notification that is nearly right: random method, params and id."""
    message: Message = {
        "jsonrpc": draw(st.sampled_from(["2.0", "2.0", "2.0", "2.0", "1.0", 2.0, None, ABSENT])),
        "method": draw(st.one_of(st.sampled_from(METHODS), st.text(max_size=12), json_scalars)),
        "id": draw(st.one_of(ids, st.just(ABSENT))),
        "params": draw(st.one_of(params_values, st.just(ABSENT))),
    }
    if draw(st.booleans()):
        message[draw(st.sampled_from(KEYS))] = draw(field_values)
    return {key: value for key, value in message.items() if value is not ABSENT}


texts = st.one_of(
    near_valid().map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=80),
    st.lists(near_valid(), max_size=3).map(json.dumps),  # batches
)
Frame = str | bytes
frames = st.one_of(texts, texts, texts, st.binary(max_size=40))


# -- (a) the decoder alone -------------------------------------------------------------------


def decode_or_refuse(text: str) -> Any:
    """Decode; anything raised but a ProtocolError fails the test."""
    outcome: Any
    try:
        outcome = codec.decode(text)
    except ProtocolError as error:
        outcome = error
    if isinstance(outcome, ProtocolError):
        assert outcome.code in DECODER_CODES, (outcome.code, text)
        assert outcome.request_id is None or not bad_id(outcome.request_id), outcome.request_id
        json.dumps(outcome.error.to_json(), allow_nan=False)
    else:
        assert outcome is None or isinstance(outcome, MESSAGE_CLASSES), outcome
    return outcome


def check_decoded(text: str) -> None:
    outcome = decode_or_refuse(text)
    again = decode_or_refuse(text)
    if isinstance(outcome, ProtocolError):
        assert isinstance(again, ProtocolError)
        assert (again.code, again.request_id) == (outcome.code, outcome.request_id)
    else:
        assert again == outcome
    try:
        value = json.loads(text)
    except ValueError:
        assert isinstance(outcome, ProtocolError), (text, outcome)
        assert (outcome.code, outcome.request_id) == (ErrorCode.PARSE_ERROR, None)
        return
    if isinstance(value, list):
        # A batch, even of one valid request, is refused as such.
        assert isinstance(outcome, ProtocolError), (text, outcome)
        assert (outcome.code, outcome.request_id) == (ErrorCode.INVALID_REQUEST, None)
        return
    if not isinstance(value, dict):
        assert isinstance(outcome, ProtocolError), (text, outcome)
        assert outcome.request_id is None
        return
    well_formed = value.get("jsonrpc") == "2.0" and isinstance(value.get("method"), str)
    if "id" not in value:
        if well_formed:
            # A notification is never answered: ignored (None) or taken, never refused.
            assert not isinstance(outcome, ProtocolError), (text, outcome.code)
            assert outcome is None or outcome.id is None, (text, outcome)
        return
    sent = value["id"]
    if isinstance(outcome, ProtocolError):
        assert outcome.request_id is None or same_id(outcome.request_id, sent), (text, outcome)
        if well_formed and bad_id(sent):
            assert (outcome.code, outcome.request_id) == (ErrorCode.INVALID_REQUEST, None), text
        elif well_formed and clean_id(sent):
            # Refused for what it said, not for its id: the answer goes to that id.
            assert same_id(outcome.request_id, sent), (text, outcome.code, outcome.request_id)
    elif outcome is not None:
        assert outcome.id is None or same_id(outcome.id, sent), (text, outcome)
        assert not bad_id(sent), (text, outcome)


@DECODER
@given(st.text(max_size=200))
def test_decoder_fuzz_text(text: str) -> None:
    check_decoded(text)


@DECODER
@given(json_values)
def test_decoder_fuzz_json_values(value: Any) -> None:
    check_decoded(json.dumps(value))


@DECODER
@given(texts)
def test_decoder_fuzz_near_valid_frames(text: str) -> None:
    check_decoded(text)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"id": 0, "method": "initialize", "params": {"protocolVersion": 1}}, Initialize),
        ({"id": "a", "method": "_abp/capabilities/list"}, ListCapabilities),
        (
            {
                "id": 2,
                "method": "_abp/call",
                "params": {"capability": "convert.markdownToHtml", "params": {"markdown": "x"}},
            },
            CallRequest,
        ),
        ({"id": 3, "method": "_abp/cancel", "params": {"callId": "c-1"}}, CancelRequest),
        ({"id": 4, "method": "_abp/shutdown", "params": {}}, Shutdown),
        ({"method": "_abp/shutdown"}, Shutdown),
        ({"method": "$/cancel_request", "params": {"requestId": 2}}, CancelPendingRequest),
    ],
)
def test_each_method_decodes_to_its_message(message: Message, expected: type) -> None:
    # The fuzz above would pass a decoder that refuses everything; this one would not.
    outcome = codec.decode(json.dumps({"jsonrpc": "2.0", **message}))
    assert isinstance(outcome, expected)
    assert outcome is not None
    assert outcome.id == message.get("id")
    if isinstance(outcome, CancelPendingRequest):
        assert same_id(outcome.request_id, 2)


# -- (b) the consumer in process -------------------------------------------------------------


@pytest.fixture(autouse=True)
def seams() -> Iterator[None]:
    """One live worker on every queue; the queue, rate limits and revokes never reach Redis."""
    queues = abp_settings().QUEUES.names()
    worker = workers.LiveWorker(
        hostname="test@fuzz", queues=queues, concurrency=4, jobs=(), pid=0, announced_at=0
    )

    async def raise_flag(job_id: str) -> None:
        return None

    with contextlib.ExitStack() as patches:
        patches.enter_context(
            mock.patch("capabilities.jobs.workers.live_workers", return_value=[worker])
        )
        patches.enter_context(mock.patch("capabilities.jobs.workers._seen", None))
        patches.enter_context(mock.patch("capabilities.calls.availability.announce_if_changed"))
        patches.enter_context(mock.patch("capabilities.jobs.queue.enqueue"))
        patches.enter_context(mock.patch("capabilities.jobs.queue.revoke"))
        patches.enter_context(
            mock.patch(
                "capabilities.access.rate_limits.retry_after_ms", mock.AsyncMock(return_value=None)
            )
        )
        patches.enter_context(
            mock.patch("capabilities.jobs.abort_flags.raise_flag_async", raise_flag)
        )
        availability.refresh()
        yield


class Peer:
    """A JSON-RPC client on a WebsocketCommunicator, keeping every frame it got."""

    def __init__(self, key: str) -> None:
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())]
        self.ws = WebsocketCommunicator(JSONRPCConsumer.as_asgi(), "/abp/rpc", headers=headers)
        self.received: list[Message] = []
        self.closed_with: int | None = None

    async def connect(self) -> None:
        connected, _ = await self.ws.connect(timeout=TIMEOUT)
        assert connected

    async def send(self, frame: Frame) -> None:
        # Straight to the application: the communicator's send_to refuses empty frames.
        key = "bytes" if isinstance(frame, bytes) else "text"
        await self.ws.send_input({"type": "websocket.receive", key: frame})

    async def read_one(self) -> Message | None:
        """The next frame the consumer sent (None: it closed the socket)."""
        output = await self.ws.receive_output(timeout=TIMEOUT)
        if output["type"] == "websocket.close":
            self.closed_with = output.get("code", 1000)
            return None
        assert output["type"] == "websocket.send", output
        assert output.get("text") is not None, f"a binary frame: {output}"
        message = json.loads(output["text"])
        assert isinstance(message, dict), message
        self.received.append(message)
        return message

    async def response(self, request_id: Any) -> Message | None:
        """Read up to the response to `request_id` (None: closed before it)."""
        while True:
            message = await self.read_one()
            if message is None:
                return None
            if "method" not in message and same_id(message.get("id"), request_id):
                return message

    async def drain(self) -> None:
        """Read until the consumer has been quiet for a moment."""
        while self.closed_with is None and not await self.ws.receive_nothing(timeout=0.1):
            await self.read_one()

    async def request(self, request_id: Any, method: str, params: Any = None) -> Message:
        message: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(json.dumps(message))
        reply = await self.response(request_id)
        assert reply is not None, f"closed ({self.closed_with}) before answering {method}"
        return reply


def check_reply(message: Message) -> None:
    """A JSON-RPC response with a result or a tabled error, or one of our notifications."""
    assert message.get("jsonrpc") == "2.0", message
    if "method" in message:
        assert message["method"] in SERVER_NOTIFICATIONS, message
        assert "id" not in message, message
        return
    assert "id" in message, message
    assert ("result" in message) != ("error" in message), message
    if "result" in message:
        return
    error = message["error"]
    code = error["code"]
    assert code in TABLE, message
    assert code not in NEVER_FOR_A_FRAME, message
    text, codes = TABLE[code]
    assert error["message"] == text, message
    data = error["data"]
    assert isinstance(data["code"], str), message
    assert isinstance(data["message"], str), message
    assert isinstance(data["retryable"], bool), message
    assert data["code"] in codes if codes is not None else data["code"] not in NAMED, message
    if message["id"] is None:
        assert code in (-32700, -32600), message
    if code == -32700:
        assert message["id"] is None, message


def classify(frame: Frame) -> tuple[str, Any]:
    """What a frame is, and the id an answer to it may carry.

    "request": well formed, with an id to echo; "malformed": an object with such an id
    but no valid request; "notification"; "other": anything answered with id null.
    """
    if isinstance(frame, bytes):
        return "other", None
    try:
        value = json.loads(frame)
    except ValueError:
        return "other", None
    if not isinstance(value, dict):
        return "other", None
    well_formed = value.get("jsonrpc") == "2.0" and isinstance(value.get("method"), str)
    if well_formed and "id" not in value:
        return "notification", None
    if "id" not in value or bad_id(value["id"]):
        return "other", None
    return ("request" if well_formed else "malformed"), value["id"]


def id_key(request_id: Any) -> str:
    return f"{type(request_id).__name__}:{json.dumps(request_id)}"


class Ledger:
    """What was sent, to hold the replies against."""

    def __init__(self) -> None:
        # id -> [(method, initialized: True, False or None for "cannot tell", clean id)]
        self.requests: dict[str, list[tuple[str | None, bool | None, bool]]] = {}
        self.unanswerable = 0  # frames that may be answered with id null

    def sent(self, frame: Frame, initialized: bool | None) -> None:
        kind, request_id = classify(frame)
        if kind in ("request", "malformed"):
            # A malformed frame's method is None: its answer, if any, is only counted.
            method = json.loads(frame)["method"] if kind == "request" else None
            sent = (method, initialized, clean_id(request_id))
            self.requests.setdefault(id_key(request_id), []).append(sent)
        if kind != "notification" and not (kind == "request" and clean_id(request_id)):
            self.unanswerable += 1


def names_initialize(frame: Frame) -> bool:
    with contextlib.suppress(ValueError):
        value = json.loads(frame)
        return isinstance(value, dict) and value.get("method") == "initialize"
    return False


async def exercise(key: str, before: list[Frame], after: list[Frame]) -> None:
    peer = Peer(key)
    await peer.connect()
    ledger = Ledger()
    initialized: bool | None = False
    try:
        for frame in before:
            ledger.sent(frame, initialized)
            await peer.send(frame)
            if names_initialize(frame):
                initialized = None  # a fuzzed initialize may have opened the session
        reply = await sentinel(peer, "sentinel-before")
        if reply is not None:
            initialized = "result" in reply
            if not initialized:
                assert reply["error"]["data"]["code"] == "NOT_INITIALIZED", reply
                opened = await peer.request("init-main", "initialize", {"protocolVersion": 1})
                assert "result" in opened, opened
                initialized = True
            for frame in after:
                ledger.sent(frame, initialized)
                await peer.send(frame)
            last = await sentinel(peer, "sentinel-after")
            assert last is None or "result" in last, last
            await peer.drain()
    finally:
        await peer.ws.disconnect(code=1000, timeout=TIMEOUT)
    check_replies(peer, ledger)
    await fresh_connection_works(key)


async def sentinel(peer: Peer, request_id: str) -> Message | None:
    """List capabilities after the fuzzed frames: its answer (None: the socket closed)."""
    if peer.closed_with is not None:
        return None
    await peer.send(
        json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "_abp/capabilities/list"})
    )
    return await peer.response(request_id)


def check_replies(peer: Peer, ledger: Ledger) -> None:
    answered: dict[str, list[Message]] = {}
    nulls = 0
    for message in peer.received:
        check_reply(message)
        if "method" in message:
            continue
        if message["id"] is None:
            nulls += 1
            continue
        answered.setdefault(id_key(message["id"]), []).append(message)
    ours = {id_key("sentinel-before"), id_key("sentinel-after"), id_key("init-main")}
    for key, replies in answered.items():
        if key in ours:
            continue
        sends = ledger.requests.get(key, [])
        # Every id answered is one we sent, never answered more often than it was sent.
        assert 0 < len(replies) <= len(sends), (key, replies, sends)
    for key, sends in ledger.requests.items():
        if len(sends) != 1 or key in ours:
            continue
        ((method, initialized, clean),) = sends
        replies = answered.get(key, [])
        if method is None:
            continue
        if clean and peer.closed_with is None and method != "_abp/call":
            # Only a call accepted waits (for a worker this test has not got).
            assert len(replies) == 1, (key, method, replies)
        if not replies:
            continue
        (reply,) = replies
        if initialized is False and method != "initialize":
            assert "error" in reply, reply
        if initialized is True:
            assert reply.get("error", {}).get("data", {}).get("code") != "NOT_INITIALIZED", reply
            if method == "initialize":
                assert "error" in reply, reply
    # Notifications are never answered: a null id answers a frame that was not one.
    assert nulls <= ledger.unanswerable, (nulls, ledger.unanswerable, peer.received)


async def fresh_connection_works(key: str) -> None:
    peer = Peer(key)
    await peer.connect()
    try:
        opened = await peer.request(1, "initialize", {"protocolVersion": 1})
        assert "result" in opened, opened
        listed = await peer.request(2, "_abp/capabilities/list")
        names = {entry["name"] for entry in listed["result"]["capabilities"]}
        assert "convert.markdownToHtml" in names
    finally:
        await peer.ws.disconnect(code=1000, timeout=TIMEOUT)


@pytest.mark.usefixtures("database")
@CONSUMER
@given(st.lists(frames, max_size=6), st.lists(frames, max_size=8))
def test_the_consumer_answers_fuzzed_frames_within_the_table(
    before: list[Frame], after: list[Frame]
) -> None:
    # A key per example: its sessions count against no other example's.
    key = agent_keys.create_key("jsonrpc fuzz")[1]
    # A fresh layer per example: its queues belong to the event loop that first used them.
    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        asyncio.run(exercise(key, before, after))


# -- a few exact answers, in process ---------------------------------------------------------


@pytest.fixture(scope="module")
def key(database: None) -> str:
    """An agent key of this module's own."""
    return agent_keys.create_key("jsonrpc in-process tests")[1]


def run_in_process(scenario: Callable[[Peer], Coroutine[Any, Any, None]], key: str) -> None:
    async def main() -> None:
        peer = Peer(key)
        await peer.connect()
        try:
            opened = await peer.request("init", "initialize", {"protocolVersion": 1})
            assert "result" in opened, opened
            await scenario(peer)
        finally:
            await peer.ws.disconnect(code=1000, timeout=TIMEOUT)

    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        asyncio.run(main())


MARKDOWN_CALL = {"capability": "convert.markdownToHtml", "params": {"markdown": "# x"}}


@pytest.mark.parametrize(("request_id", "twin"), [(0, "0"), (7, 7.0), ("c", "C")])
def test_a_cancel_request_answers_its_call_once_and_frees_the_id(
    key: str, request_id: Any, twin: Any
) -> None:
    # 0 is falsy: an id, all the same (the ACP SDKs start counting there).
    async def scenario(peer: Peer) -> None:
        # Accepted and queued (no worker here): in flight until cancelled.
        await peer.send(
            json.dumps(
                {"jsonrpc": "2.0", "id": request_id, "method": "_abp/call", "params": MARKDOWN_CALL}
            )
        )
        reused = await peer.request(request_id, "_abp/capabilities/list")
        assert reused["error"]["code"] == -32600, reused
        assert reused["error"]["data"]["details"] == {"path": "id"}
        # Its twin is another id, not in flight.
        assert "result" in await peer.request(twin, "_abp/capabilities/list")
        cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": twin}}
        await peer.send(json.dumps(cancel))  # names no request of ours: ignored
        cancel["params"] = {"requestId": request_id}
        await peer.send(json.dumps(cancel))
        cancelled = await peer.response(request_id)
        assert cancelled is not None
        assert cancelled["error"]["code"] == -32800, cancelled
        assert cancelled["error"]["data"]["code"] == "CANCELLED"
        await peer.send(json.dumps(cancel))  # a second cancel changes nothing
        await peer.drain()
        answers = [m for m in peer.received if same_id(m.get("id"), request_id)]
        assert answers == [reused, cancelled]
        # Answered, so no longer in flight: the id may be used again.
        assert "result" in await peer.request(request_id, "_abp/capabilities/list")

    run_in_process(scenario, key)


@pytest.mark.parametrize(
    ("method", "params", "code", "path"),
    [
        ("_abp/call", {"params": {}}, "MISSING_PARAM", "params.capability"),
        ("_abp/call", {**MARKDOWN_CALL, "timeout": -1}, "INVALID_TYPE", "params.timeout"),
        ("_abp/call", {**MARKDOWN_CALL, "callId": ""}, "INVALID_PARAMS", "params.callId"),
        (
            "_abp/call",
            {**MARKDOWN_CALL, "_meta": {"progressToken": True}},
            "INVALID_TYPE",
            "params._meta.progressToken",
        ),
        (
            "_abp/call",
            {"capability": "convert.markdownToHtml", "params": {"markdown": 5}},
            "INVALID_TYPE",
            "params.params.markdown",
        ),
        ("_abp/cancel", {}, "MISSING_PARAM", "params.callId"),
        ("_abp/call", [1, 2], "INVALID_PARAMS", "params"),
    ],
)
def test_a_refused_field_is_named_as_the_client_sent_it(
    key: str, method: str, params: Any, code: str, path: str
) -> None:
    async def scenario(peer: Peer) -> None:
        reply = await peer.request("r", method, params)
        assert reply["error"]["code"] == -32602, reply
        assert reply["error"]["data"]["code"] == code, reply
        assert reply["error"]["data"]["details"]["path"] == path, reply

    run_in_process(scenario, key)


BOUNDARY_IDS = ["x" * 200, "é" * 200, "日本語" * 66, "", 10**199, -(10**198), 1.5, 0, 1e300]


@pytest.mark.parametrize("request_id", BOUNDARY_IDS)
def test_ids_of_up_to_200_characters_and_numbers_decode_as_sent(request_id: Any) -> None:
    # docs/jsonrpc.md: "strings (up to 200 characters) and numbers, echoed exactly".
    text = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "_abp/capabilities/list"})
    outcome = codec.decode(text)
    assert isinstance(outcome, ListCapabilities)
    assert same_id(outcome.id, request_id)


@pytest.mark.parametrize("request_id", BOUNDARY_IDS)
def test_ids_of_up_to_200_characters_and_numbers_are_echoed_exactly(
    key: str, request_id: Any
) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.send(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "_abp/capabilities/list"})
        )
        reply = await peer.read_one()
        assert reply is not None
        assert same_id(reply["id"], request_id), reply
        assert "result" in reply, reply

    run_in_process(scenario, key)


@pytest.mark.parametrize("request_id", ["x" * 201, "a\x00b", "\ud800", 10**200, None, True])
def test_an_id_out_of_bounds_is_refused_with_id_null(key: str, request_id: Any) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.send(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "_abp/capabilities/list"})
        )
        reply = await peer.read_one()
        assert reply is not None
        assert reply["id"] is None
        assert reply["error"]["code"] == -32600

    run_in_process(scenario, key)
