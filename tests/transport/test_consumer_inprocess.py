"""The consumer in-process: Channels' WebsocketCommunicator and its in-memory layer.

No Daphne, no Redis, no worker: the shell's own wiring (frames decoded and handed
to the session, its actions performed against the real database, notes heard
through a channel layer) tested fast, beside the real-stack tests. A test that
starts a job patches the seams that would reach Redis or the broker (the queue, the
rate limiter, stopping the work) and plays the worker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import OperationalError
from django.test import override_settings

from capabilities.access import agent_keys
from capabilities.calls import availability, budgets, start
from capabilities.calls.availability import AVAILABILITY_GROUP
from capabilities.conf import abp_settings
from capabilities.jobs import lifecycle, notes, workers
from capabilities.models import AgentSession, Job, JobStatus, session_group
from capabilities.protocol import replies
from capabilities.transport.consumer import ABPConsumer

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
TIMEOUT = 5.0
Envelope = dict[str, Any]


@pytest.fixture(scope="module")
def key(database: None) -> str:
    """An agent key of this module's own: its sessions count against no other test's."""
    return agent_keys.create_key("in-process consumer tests")[1]


@pytest.fixture(autouse=True)
def in_memory_layer() -> Iterator[None]:
    # A fresh layer per test: its queues belong to the event loop that first used them.
    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        yield


@pytest.fixture(autouse=True)
def one_live_worker() -> Iterator[None]:
    """Live workers are read from Redis: here, one worker on every queue, always."""
    queues = abp_settings().QUEUES.names()
    worker = workers.LiveWorker(
        hostname="test@inprocess", queues=queues, concurrency=4, jobs=(), pid=0, announced_at=0
    )
    with (
        mock.patch("capabilities.jobs.workers.live_workers", return_value=[worker]),
        mock.patch("capabilities.jobs.workers._seen", None),
        mock.patch("capabilities.calls.availability.announce_if_changed"),
    ):
        availability.refresh()
        yield


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


class Agent:
    """An agent on a WebsocketCommunicator."""

    def __init__(self, key: str | None) -> None:
        headers = [(b"host", b"testserver")]
        if key is not None:
            headers.append((b"authorization", f"Bearer {key}".encode()))
        self.ws = WebsocketCommunicator(ABPConsumer.as_asgi(), "/abp/ws", headers=headers)
        self.numbers = iter(range(1, 1000))

    async def connect(self) -> None:
        connected, _ = await self.ws.connect(timeout=TIMEOUT)
        assert connected

    async def send(self, message_type: str, payload: dict[str, Any]) -> str:
        message_id = f"m{next(self.numbers)}"
        frame = {"type": message_type, "id": message_id, "payload": payload}
        await self.ws.send_to(text_data=json.dumps(frame))
        return message_id

    async def receive(self) -> Envelope:
        envelope: Envelope = await self.ws.receive_json_from(timeout=TIMEOUT)
        return envelope

    async def reply_to(self, message_id: str) -> Envelope:
        envelope = await self.receive()
        assert envelope["id"] == message_id, envelope
        return envelope

    async def closed_with(self) -> int:
        """The close the consumer sent (after every frame before it was read)."""
        output = await self.ws.receive_output(timeout=TIMEOUT)
        assert output["type"] == "websocket.close", output
        code: int = output["code"]
        return code

    async def initialize(self) -> Envelope:
        message_id = await self.send(
            "initialize",
            {
                "agent": {"name": "in-process", "version": "1.0"},
                "protocolVersion": "0.1",
                "features": {"notifications": False, "progress": True},
            },
        )
        reply = await self.reply_to(message_id)
        assert reply["type"] == "initialize-result"
        return reply

    async def disconnect(self, code: int = 1000) -> None:
        """The client's close reaches the consumer; its disconnect runs to the end."""
        await self.ws.disconnect(code=code, timeout=TIMEOUT)

    async def nothing_more(self) -> None:
        assert await self.ws.receive_nothing(timeout=0.2)


async def session_row(session_id: str) -> AgentSession:
    row: AgentSession = await database_sync_to_async(AgentSession.objects.get)(pk=session_id)
    return row


async def job_of(session_id: str, call_id: str) -> Job | None:
    jobs = Job.objects.filter(session_id=uuid.UUID(session_id), call_id=call_id)
    job: Job | None = await database_sync_to_async(jobs.first)()
    return job


# -- connecting ---------------------------------------------------------------------------


def test_a_connection_without_a_credential_is_told_why_then_closed_with_4401() -> None:
    # No database either: the credential is refused before any lookup.
    async def scenario() -> None:
        agent = Agent(key=None)
        await agent.connect()  # accepted, so that the reason can be read
        note = await agent.receive()
        assert note["type"] == "notification"
        assert note["payload"]["event"] == "notifications/error"
        data = note["payload"]["data"]
        assert data["code"] == "PERMISSION_DENIED"
        assert data["retryable"] is False
        assert data["details"] == {"reason": "missing-credentials", "closeCode": 4401}
        assert await agent.closed_with() == 4401
        await agent.disconnect(4401)

    with override_settings(ABP={**settings.ABP, "ALLOW_ANONYMOUS": False}):
        run(scenario)


def test_a_refusal_that_needs_no_database_is_not_held_up_by_its_thread() -> None:
    # A busy database thread must not hold a handshake past Daphne's timeout (5 s),
    # nor can a flood of credential-less connections queue on it.
    busy = threading.Event()

    async def scenario() -> None:
        # The database thread itself (Channels' hops run there), kept busy.
        holding = asyncio.ensure_future(sync_to_async(busy.wait)(TIMEOUT * 2))
        agents = [Agent(key=presented) for presented in (None, "abp-page-not-a-token")]
        try:
            for agent in agents:
                await agent.connect()
                note = await agent.receive()
                assert note["payload"]["data"]["details"]["closeCode"] == 4401
                assert await agent.closed_with() == 4401
            assert not holding.done()
        finally:
            busy.set()
            await holding
        for agent in agents:  # Channels' own clean-up after a close does use the thread
            await agent.disconnect(4401)

    with override_settings(ABP={**settings.ABP, "ALLOW_ANONYMOUS": False}):
        run(scenario)


def test_an_unknown_key_is_refused_with_4401(database: None) -> None:
    async def scenario() -> None:
        agent = Agent(key="abp_nosuchkey_" + "x" * 43)
        await agent.connect()
        note = await agent.receive()
        assert note["payload"]["data"]["details"]["closeCode"] == 4401
        assert await agent.closed_with() == 4401
        await agent.disconnect(4401)

    run(scenario)


def test_a_key_that_cannot_be_checked_now_is_told_to_try_again_later_with_1013(
    key: str,
) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        assert await agent.closed_with() == 1013
        await agent.disconnect(1013)

    restarting = OperationalError("terminating connection due to administrator command")
    with mock.patch("capabilities.access.agent_keys.find_key", side_effect=restarting):
        run(scenario)


# -- initialize -----------------------------------------------------------------------------


def test_initialize_opens_a_session_that_a_drop_detaches(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        reply = await agent.initialize()
        payload = reply["payload"]
        assert set(payload) == {
            "sessionId",
            "protocolVersion",
            "app",
            "capabilities",
            "features",
            "resumeToken",
        }
        assert payload["protocolVersion"] == "0.1"
        names = {capability["name"] for capability in payload["capabilities"]}
        assert {"export.pdf", "process.image", "convert.markdownToHtml"} <= names
        assert payload["features"] == {
            "notifications": False,
            "progress": True,
            "elicitation": False,
        }
        row = await session_row(payload["sessionId"])
        assert row.agent_name == "in-process"
        assert row.auth == "key"
        assert row.closed_at is None
        assert row.detached_at is None
        # A key's session is resumable: the drop detaches it for the grace period.
        await agent.disconnect(1006)
        row = await session_row(payload["sessionId"])
        assert row.detached_at is not None
        assert row.closed_at is None

    run(scenario)


def test_a_second_initialize_is_already_initialized(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        first = await agent.initialize()
        message_id = await agent.send("initialize", {})
        reply = await agent.reply_to(message_id)
        assert reply["type"] == "initialize-result"
        assert reply["payload"]["error"]["code"] == "ALREADY_INITIALIZED"
        assert first["payload"]["sessionId"]
        await agent.disconnect()

    run(scenario)


# -- frames -----------------------------------------------------------------------------------


def test_a_frame_before_initialize_is_not_initialized(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        message_id = await agent.send(
            "capabilities/call", {"capability": "export.pdf", "params": {"html": "<p>x</p>"}}
        )
        reply = await agent.reply_to(message_id)
        assert reply["type"] == "capabilities/call-result"
        assert reply["payload"]["success"] is False
        assert reply["payload"]["error"]["code"] == "NOT_INITIALIZED"
        # Not even JSON: a notification, the connection stays usable.
        await agent.ws.send_to(text_data="{oops")
        note = await agent.receive()
        assert note["type"] == "notification"
        assert note["payload"]["data"]["code"] == "PARSE_ERROR"
        assert (await agent.initialize())["payload"]["sessionId"]
        await agent.disconnect()

    run(scenario)


def test_a_call_of_an_unknown_capability_is_answered_with_its_error(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        session_id = (await agent.initialize())["payload"]["sessionId"]
        message_id = await agent.send(
            "capabilities/call",
            {"capability": "export.docx", "params": {}, "options": {"callId": "c-1"}},
        )
        reply = await agent.reply_to(message_id)
        assert reply["type"] == "capabilities/call-result"
        assert reply["payload"]["callId"] == "c-1"
        assert reply["payload"]["success"] is False
        error = reply["payload"]["error"]
        assert error["code"] == "UNKNOWN_CAPABILITY"
        assert error["details"] == {"capability": "export.docx"}
        assert await job_of(session_id, "c-1") is None  # nothing stored
        await agent.nothing_more()
        await agent.disconnect()

    run(scenario)


def test_a_cancel_of_an_unknown_call_is_not_found(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        await agent.initialize()
        message_id = await agent.send("capabilities/cancel", {"callId": "ghost"})
        reply = await agent.reply_to(message_id)
        assert reply["type"] == "capabilities/cancel-result"
        assert reply["payload"] == {
            "callId": "ghost",
            "cancelled": False,
            "reason": replies.NOT_FOUND,
        }
        await agent.disconnect()

    run(scenario)


def test_shutdown_ends_the_session_and_closes_with_1000(key: str) -> None:
    async def scenario() -> None:
        agent = Agent(key)
        await agent.connect()
        session_id = (await agent.initialize())["payload"]["sessionId"]
        await agent.send("shutdown", {"reason": "done"})
        assert await agent.closed_with() == 1000
        await agent.disconnect(1000)
        row = await session_row(session_id)
        assert row.closed_at is not None
        assert row.close_reason == "shutdown: done"
        assert row.detached_at is None  # ended, not waiting for a resume

    run(scenario)


# -- a call's life, with the worker played by the test --------------------------------------

MARKDOWN = {"markdown": "# Title"}


class Seams:
    """The seams a started call would take to Redis and the broker, patched."""

    def __init__(self) -> None:
        self.enqueued: list[str] = []
        self.stopped: list[str] = []

    def __enter__(self) -> Seams:
        async def raise_flag(job_id: str) -> None:
            self.stopped.append(job_id)

        def enqueue(job: Job) -> None:
            self.enqueued.append(str(job.id))

        self.patches = contextlib.ExitStack()
        self.patches.enter_context(mock.patch("capabilities.jobs.queue.enqueue", enqueue))
        # Calls per minute are counted in Redis; none runs here.
        self.patches.enter_context(
            mock.patch(
                "capabilities.access.rate_limits.retry_after_ms", mock.AsyncMock(return_value=None)
            )
        )
        # The abort flag (Redis) and the revoke (the broker).
        self.patches.enter_context(
            mock.patch("capabilities.jobs.abort_flags.raise_flag_async", raise_flag)
        )
        self.patches.enter_context(mock.patch("capabilities.jobs.queue.revoke"))
        return self

    def __exit__(self, *exc: object) -> None:
        self.patches.close()


async def start_call(agent: Agent, session_id: str, call_id: str) -> tuple[str, Job]:
    message_id = await agent.send(
        "capabilities/call",
        {
            "capability": "convert.markdownToHtml",
            "params": MARKDOWN,
            "options": {"callId": call_id},
        },
    )
    for _ in range(100):
        job = await job_of(session_id, call_id)
        if job is not None:
            return message_id, job
        await asyncio.sleep(0.02)
    raise AssertionError(f"no job for {call_id}")


def test_a_result_the_worker_settles_reaches_the_agent_once(key: str) -> None:
    async def scenario() -> None:
        with Seams() as seams:
            agent = Agent(key)
            await agent.connect()
            session_id = (await agent.initialize())["payload"]["sessionId"]
            message_id, job = await start_call(agent, session_id, "c-1")
            assert seams.enqueued == [str(job.id)]
            # The worker: settle, then the note to the session's group.
            outcome = lifecycle.Outcome.succeeded({"html": "<h1>Title</h1>"})
            settle = database_sync_to_async(lifecycle.settle)
            assert await settle(job.id, outcome, work_stopped=True)
            layer = get_channel_layer()
            await layer.group_send(session_group(session_id), notes.job_settled("c-1"))
            reply = await agent.reply_to(message_id)
            assert reply["type"] == "capabilities/call-result"
            assert reply["payload"]["callId"] == "c-1"
            assert reply["payload"]["success"] is True
            assert reply["payload"]["data"] == {"html": "<h1>Title</h1>"}
            stored = await job_of(session_id, "c-1")
            assert stored is not None
            assert stored.delivered_at is not None
            # A second note (a nudge, a duplicate) sends nothing more.
            await layer.group_send(session_group(session_id), notes.job_settled("c-1"))
            await agent.nothing_more()
            await agent.disconnect()

    run(scenario)


def test_a_cancel_of_a_running_call_answers_then_stops_the_work(key: str) -> None:
    async def scenario() -> None:
        with Seams() as seams:
            agent = Agent(key)
            await agent.connect()
            session_id = (await agent.initialize())["payload"]["sessionId"]
            call_message, job = await start_call(agent, session_id, "c-1")
            cancel_message = await agent.send(
                "capabilities/cancel", {"callId": "c-1", "reason": "no longer needed"}
            )
            cancel_reply = await agent.reply_to(cancel_message)
            assert cancel_reply["payload"] == {"callId": "c-1", "cancelled": True}
            result = await agent.reply_to(call_message)
            assert result["payload"]["cancelled"] is True
            assert result["payload"]["error"]["code"] == "CANCELLED"
            await agent.disconnect()  # drains the background work
            assert seams.stopped == [str(job.id)]
            stored = await job_of(session_id, "c-1")
            assert stored is not None
            assert stored.status == JobStatus.CANCELLED
            assert stored.cancel_source == "agent"
            assert stored.cancel_reason == "no longer needed"
            assert stored.delivered_at is not None

    run(scenario)


# -- a cancel right behind its call ------------------------------------------------------


class HeldStart:
    """`budgets.create_job` held in the database thread until released.

    `before_row`: held before the row is written (a cancel then comes in time);
    otherwise held after it (the cancel then waits for the start).
    """

    def __init__(self, *, before_row: bool) -> None:
        self.before_row = before_row
        self.reached = threading.Event()
        self.release = threading.Event()
        self.real = budgets.create_job

    def __call__(self, *args: Any, **kwargs: Any) -> Job:
        if self.before_row:
            self.reached.set()
            assert self.release.wait(TIMEOUT)
        job = self.real(*args, **kwargs)
        if not self.before_row:
            self.reached.set()
            assert self.release.wait(TIMEOUT)
        return job

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, TIMEOUT)


async def send_call(agent: Agent, call_id: str) -> str:
    options = {"callId": call_id}
    return await agent.send(
        "capabilities/call",
        {"capability": "convert.markdownToHtml", "params": MARKDOWN, "options": options},
    )


async def call_then_cancel(key: str, held: HeldStart) -> tuple[Agent, str, str, str]:
    """A connected agent's call "c-1", held in its start, then its cancel: the ids."""
    agent = Agent(key)
    await agent.connect()
    session_id = (await agent.initialize())["payload"]["sessionId"]
    call_message = await send_call(agent, "c-1")
    await held.wait_reached()
    cancel_message = await agent.send("capabilities/cancel", {"callId": "c-1"})
    return agent, session_id, call_message, cancel_message


def test_a_cancel_that_wins_the_start_is_answered_once_the_cancelled_row_is_written(
    key: str,
) -> None:
    held = HeldStart(before_row=True)

    async def scenario() -> None:
        with Seams() as seams, mock.patch("capabilities.calls.budgets.create_job", held):
            agent, session_id, call_message, cancel_message = await call_then_cancel(key, held)
            # The cancel won the start, but nothing is said before the row exists.
            await agent.nothing_more()
            held.release.set()
            cancel_reply = await agent.reply_to(cancel_message)
            assert cancel_reply["payload"] == {"callId": "c-1", "cancelled": True}
            result = await agent.reply_to(call_message)
            assert result["payload"]["error"]["code"] == "CANCELLED"
            assert result["payload"]["error"]["details"] == {"source": "agent"}
            await agent.nothing_more()
            await agent.disconnect()
            stored = await job_of(session_id, "c-1")
            assert stored is not None
            assert stored.status == JobStatus.CANCELLED
            assert stored.cancel_source == "agent"
            assert stored.delivered_at is not None
            assert stored.started_at is None
            assert stored.dispatched_at is None
            # Never sent to a worker, so nothing to stop.
            assert seams.enqueued == []
            assert seams.stopped == []

    run(scenario)


def test_a_cancel_that_comes_once_the_row_is_written_waits_for_it_then_settles_it(
    key: str,
) -> None:
    held = HeldStart(before_row=False)

    async def scenario() -> None:
        with Seams() as seams, mock.patch("capabilities.calls.budgets.create_job", held):
            agent, session_id, call_message, cancel_message = await call_then_cancel(key, held)
            await agent.nothing_more()
            held.release.set()
            cancel_reply = await agent.reply_to(cancel_message)
            assert cancel_reply["payload"] == {"callId": "c-1", "cancelled": True}
            result = await agent.reply_to(call_message)
            assert result["payload"]["error"]["code"] == "CANCELLED"
            await agent.disconnect()
            stored = await job_of(session_id, "c-1")
            assert stored is not None
            assert stored.status == JobStatus.CANCELLED
            assert seams.enqueued == [str(stored.id)]
            assert seams.stopped == [str(stored.id)]

    run(scenario)


def test_a_call_is_read_while_the_one_before_starts_unless_it_reuses_its_id(key: str) -> None:
    held = HeldStart(before_row=True)

    async def scenario() -> None:
        with Seams(), mock.patch("capabilities.calls.budgets.create_job", held):
            agent = Agent(key)
            await agent.connect()
            await agent.initialize()
            await send_call(agent, "c-1")
            await held.wait_reached()
            # Another call is read at once (calls/start_order.py): the session answers
            # this one itself, while the first's row is still being written.
            other = await agent.send(
                "capabilities/call",
                {"capability": "no.such", "params": {}, "options": {"callId": "c-2"}},
            )
            reply = await agent.reply_to(other)
            assert reply["payload"]["error"]["code"] == "UNKNOWN_CAPABILITY"
            # A call with the first one's id: refused, but only once the first is in.
            again = await send_call(agent, "c-1")
            await agent.nothing_more()
            held.release.set()
            reply = await agent.reply_to(again)
            assert reply["payload"]["error"]["code"] == "INVALID_PARAMS"
            await agent.disconnect()

    run(scenario)


class ReportGate:
    """`start.start` for call "c-1" held after its row is written, before it is reported."""

    def __init__(self) -> None:
        self.real = start.start
        self.written = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, principal: Any, call: start.CallRequest) -> Job:
        job = await self.real(principal, call)
        if call.call_id == "c-1":
            self.written.set()
            await self.release.wait()
        return job


def test_a_cancel_never_overtakes_an_earlier_cancel_that_waits_for_its_calls_row(
    key: str,
) -> None:
    # Otherwise the later cancel of a running call could free the agent's share, and
    # the dispatcher start the other call, before that call's own earlier cancel.
    gate = ReportGate()

    async def scenario() -> None:
        with Seams() as seams, mock.patch("capabilities.calls.start.start", gate):
            agent = Agent(key)
            await agent.connect()
            await agent.initialize()
            await send_call(agent, "c-0")
            await _until(lambda: len(seams.enqueued) == 1)
            await agent.nothing_more()  # and reported to its session
            await send_call(agent, "c-1")
            await asyncio.wait_for(gate.written.wait(), TIMEOUT)
            first = await agent.send("capabilities/cancel", {"callId": "c-1"})
            second = await agent.send("capabilities/cancel", {"callId": "c-0"})
            # c-1's cancel waits for its row to be reported; c-0's waits behind it.
            await agent.nothing_more()
            gate.release.set()
            replies = [await agent.receive() for _ in range(4)]
            order = [r["id"] for r in replies if r["type"] == "capabilities/cancel-result"]
            assert order == [first, second]
            await agent.disconnect()

    run(scenario)


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(int(TIMEOUT * 100)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not in time")


class HeldFirstStart(HeldStart):
    """`budgets.create_job` held for call "c-0" only, before its row."""

    def __init__(self) -> None:
        super().__init__(before_row=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Job:
        if kwargs.get("call_id") != "c-0":
            return self.real(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def test_a_second_cancel_of_a_call_cancelled_before_its_row_finds_the_row(key: str) -> None:
    held = HeldFirstStart()

    async def scenario() -> None:
        with Seams(), mock.patch("capabilities.calls.budgets.create_job", held):
            agent = Agent(key)
            await agent.connect()
            await agent.initialize()
            await send_call(agent, "c-0")
            await held.wait_reached()
            # c-1's row waits for the database thread, behind c-0's.
            await send_call(agent, "c-1")
            first = await agent.send("capabilities/cancel", {"callId": "c-1"})
            second = await agent.send("capabilities/cancel", {"callId": "c-1"})
            held.release.set()
            # The first cancel won c-1's start: both answered once its row is written.
            assert (await agent.reply_to(first))["payload"] == {"callId": "c-1", "cancelled": True}
            assert (await agent.receive())["type"] == "capabilities/call-result"
            again = (await agent.reply_to(second))["payload"]
            # Not "not found": the session let the call go, and its row is read once
            # written, cancelled already.
            assert again == {"callId": "c-1", "cancelled": True}
            assert first != second
            await agent.disconnect()

    run(scenario)


class OldConnectionWritesFirst(HeldStart):
    """The re-sent copy of call "c-1" held before its row, once the first copy's row is
    written: as when the session's old connection read that copy late and wrote it."""

    def __init__(self) -> None:
        super().__init__(before_row=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Job:
        self.real(*args, **{**kwargs, "ticket": None})
        return super().__call__(*args, **kwargs)


def test_a_cancel_of_a_resent_call_waits_for_its_start_and_cancels_the_first_copys_row(
    key: str,
) -> None:
    held = OldConnectionWritesFirst()

    async def scenario() -> None:
        with Seams() as seams, mock.patch("capabilities.calls.budgets.create_job", held):
            first = Agent(key)
            await first.connect()
            opened = (await first.initialize())["payload"]
            session_id, token = opened["sessionId"], opened["resumeToken"]
            await first.disconnect(1006)
            agent = Agent(key)
            await agent.connect()
            assert (await resume(agent, session_id, token))["payload"]["heldCalls"] == []
            options = {"callId": "c-1", "resent": True}
            payload = {"capability": "convert.markdownToHtml", "params": MARKDOWN}
            call_message = await agent.send("capabilities/call", {**payload, "options": options})
            await held.wait_reached()
            cancel_message = await agent.send("capabilities/cancel", {"callId": "c-1"})
            # Not answered before the start: a "cancelled" now would leave the first
            # copy's row to run, and be answered a second time.
            await agent.nothing_more()
            held.release.set()
            cancel_reply = await agent.reply_to(cancel_message)
            assert cancel_reply["payload"] == {"callId": "c-1", "cancelled": True}
            result = await agent.reply_to(call_message)
            assert result["payload"]["error"]["code"] == "CANCELLED"
            await agent.nothing_more()
            await agent.disconnect()
            stored = await job_of(session_id, "c-1")
            assert stored is not None
            assert stored.status == JobStatus.CANCELLED
            assert stored.delivered_at is not None
            assert seams.stopped == [str(stored.id)]

    run(scenario)


async def resume(agent: Agent, session_id: str, token: str) -> Envelope:
    message_id = await agent.send(
        "initialize",
        {"agent": {"name": "in-process"}, "resume": {"sessionId": session_id, "token": token}},
    )
    return await agent.reply_to(message_id)


def test_a_resume_that_fails_on_the_channel_layer_leaves_the_token_working(key: str) -> None:
    async def scenario() -> None:
        first = Agent(key)
        await first.connect()
        opened = (await first.initialize())["payload"]
        session_id, token = opened["sessionId"], opened["resumeToken"]
        await first.disconnect(1006)

        # Redis restarting under the resume: the layer fails it, the socket closes.
        layer = get_channel_layer()
        real_group_add = layer.group_add

        async def group_add(group: str, channel: str) -> None:
            if group == AVAILABILITY_GROUP:  # the session's own group was joined fine
                raise ConnectionError("Redis is restarting")
            await real_group_add(group, channel)

        failing = mock.AsyncMock(side_effect=group_add)
        second = Agent(key)
        await second.connect()
        with mock.patch.object(layer, "group_add", failing):
            await second.send(
                "initialize",
                {
                    "agent": {"name": "in-process"},
                    "resume": {"sessionId": session_id, "token": token},
                },
            )
            with contextlib.suppress(Exception):
                await second.ws.wait(timeout=TIMEOUT)
        assert failing.await_count >= 1

        # Back: the same token still resumes the session.
        third = Agent(key)
        await third.connect()
        reply = (await resume(third, session_id, token))["payload"]
        assert "error" not in reply, reply
        assert reply["sessionId"] == session_id
        assert reply["heldCalls"] == []
        await third.disconnect(1006)

    run(scenario)


def test_a_resume_whose_takeover_notice_the_channel_layer_refuses_still_answers(
    key: str,
) -> None:
    # The Daphne holding the session killed and Redis stopped at once (issue #46): the
    # notice to the old connection failed after the new token was committed, the
    # socket closed with 1011 and no reply, and the token it had was refused next.
    async def scenario() -> None:
        old = Agent(key)  # still holds the session: a half-open socket
        await old.connect()
        opened = (await old.initialize())["payload"]
        session_id, token = opened["sessionId"], opened["resumeToken"]

        layer = get_channel_layer()
        real_group_send = layer.group_send
        refusing = {"on": True}

        async def group_send(group: str, message: dict[str, Any]) -> None:
            if refusing["on"] and message.get("type") == "session.superseded":
                raise ConnectionError("Redis is restarting")
            await real_group_send(group, message)

        failing = mock.AsyncMock(side_effect=group_send)
        with mock.patch.object(layer, "group_send", failing):
            new = Agent(key)
            await new.connect()
            reply = (await resume(new, session_id, token))["payload"]
            assert "error" not in reply, reply
            assert reply["resumeToken"] != token
            # Redis back: the old connection is told in the background, and goes.
            refusing["on"] = False
            assert await old.closed_with() == 4409
        assert failing.await_count >= 2
        await new.disconnect(1006)

    run(scenario)


def test_a_socket_opened_on_a_stopping_process_is_closed_with_1012() -> None:
    async def scenario() -> None:
        agent = Agent(key=None)
        await agent.connect()
        assert await agent.closed_with() == 1012  # resume elsewhere

    with mock.patch("capabilities.calls.draining.is_draining", return_value=True):
        run(scenario)
