"""Isolation between users, on every door, with real clients on the real stack.

Users A and B each have a key of their own. B cannot list, read, wait for or cancel
A's MCP tasks (both wires), resume A's session even with its resume token, cancel
A's call, or open a download from a job's id. Deactivating A closes A's connections
(ABP, JSON-RPC, an MCP stateful session) within the code's own bound, answers A's
call in flight once, and refuses A from then on.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx2
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from websockets.exceptions import ConnectionClosed

from capabilities.access import agent_keys, page_tokens
from capabilities.endings import user_deactivation
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from capabilities.protocol import replies
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.mcp_clients import RawModern, RawSession
from tests.support.rpc_agent import RpcAgent, rpc_url
from tests.support.stack import Stack
from tests.support.waiting import eventually

LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}  # ten seconds, unless cancelled
SHORT = {"mode": "checkpoint", "steps": 50, "stepMs": 20}  # one second
INVALID_PARAMS = -32602


def new_user() -> Any:
    return get_user_model().objects.create_user(username=f"iso-{uuid.uuid4().hex[:10]}")


def key_of(user: Any) -> str:
    return agent_keys.create_key("isolation", owner=user)[1]


def origin_of(stack: Stack) -> str:
    return stack.http_url.rstrip("/")


def page_of(stack: Stack, user: Any | None) -> Agent:
    """A page's connection, with a page token served to `user` (None: signed out)."""
    token = page_tokens.issue(origin_of(stack), user_id=user.pk if user is not None else None)
    return Agent(
        stack.ws_url,
        key=None,
        subprotocols=["abp", f"abp.bearer.{token}"],
        additional_headers={"Origin": origin_of(stack)},
    )


def without_ids(errors: list[dict[str, Any]], *ids: str) -> list[dict[str, Any]]:
    """The errors with the task ids they name taken out (unknown and foreign compare equal)."""
    found = []
    for error in errors:
        message = error["message"]
        for task_id in ids:
            message = message.replace(task_id, "ID")
        found.append({**error, "message": message})
    return found


# -- MCP tasks --------------------------------------------------------------------------


async def rpc(session: RawSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The one answer to a request on the 2025 wire."""
    request_id = uuid.uuid4().hex
    async with session.request(request_id, method, params) as messages:
        [answer] = [message async for message in messages if message.get("id") == request_id]
    return answer


def mcp(stack: Stack, scenario: Callable[[httpx2.AsyncClient, str], Awaitable[None]]) -> None:
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            await scenario(http, f"{stack.http_url}/mcp")

    anyio.run(main)


def test_another_users_tasks_are_unknown_on_the_2025_wire(stack: Stack) -> None:
    ann, bob = new_user(), new_user()
    keys = {"ann": key_of(ann), "ann's other": key_of(ann), "bob": key_of(bob)}
    found: dict[str, Any] = {}
    unknown = str(uuid.uuid4())

    async def scenario(http: httpx2.AsyncClient, url: str) -> None:
        sessions = {who: RawSession(http, url, key) for who, key in keys.items()}
        for session in sessions.values():
            await session.open()
        try:
            mine, other, theirs = sessions["ann"], sessions["ann's other"], sessions["bob"]
            call = {"name": "test.sleep", "arguments": LONG, "task": {}}
            task_id = (await rpc(mine, "tools/call", call))["result"]["task"]["taskId"]
            found["task"] = task_id
            found["listed"] = {
                who: [
                    task["taskId"] for task in (await rpc(s, "tasks/list", {}))["result"]["tasks"]
                ]
                for who, s in sessions.items()
            }
            found["foreign"] = [
                (await rpc(theirs, method, {"taskId": task_id}))["error"]
                for method in ("tasks/get", "tasks/result", "tasks/cancel")
            ]
            found["unknown"] = [
                (await rpc(theirs, method, {"taskId": unknown}))["error"]
                for method in ("tasks/get", "tasks/result", "tasks/cancel")
            ]
            found["cursor"] = (await rpc(theirs, "tasks/list", {"cursor": task_id}))["error"]
            # A's MCP session id with B's key: the session is not found either.
            stolen = {**theirs.headers(), "Mcp-Session-Id": mine.session_id}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}
            found["stolen session"] = (await http.post(url, headers=stolen, json=body)).status_code
            found["still"] = (await rpc(other, "tasks/get", {"taskId": task_id}))["result"]
            found["cancelled"] = (await rpc(other, "tasks/cancel", {"taskId": task_id}))["result"]
        finally:
            for session in sessions.values():
                await session.close()

    mcp(stack, scenario)
    task_id = found["task"]
    # A's tasks are A's from any of A's keys and sessions; B lists none of them.
    assert found["listed"] == {"ann": [task_id], "ann's other": [task_id], "bob": []}
    assert without_ids(found["foreign"], task_id) == without_ids(found["unknown"], unknown)
    assert {error["code"] for error in found["foreign"]} == {INVALID_PARAMS}
    assert found["cursor"]["code"] == INVALID_PARAMS
    assert found["stolen session"] == 404
    # B's cancel did nothing; A's own (from A's other key) did.
    assert found["still"]["status"] == "working"
    assert found["cancelled"]["status"] == "cancelled"
    job = Job.objects.get(pk=task_id)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)


def test_another_users_tasks_are_unknown_on_the_2026_wire(stack: Stack) -> None:
    ann, bob = new_user(), new_user()
    found: dict[str, Any] = {}
    unknown = str(uuid.uuid4())
    methods: list[tuple[str, dict[str, Any]]] = [
        ("tasks/get", {}),
        ("tasks/cancel", {}),
        ("tasks/update", {"inputResponses": {}}),
    ]

    keys = key_of(ann), key_of(ann), key_of(bob)

    async def scenario(http: httpx2.AsyncClient, url: str) -> None:
        mine, other, theirs = (RawModern(http, url, key) for key in keys)
        created = await mine.rpc("tools/call", {"name": "test.sleep", "arguments": LONG})
        task_id = created["result"]["taskId"]
        found["task"] = task_id
        found["foreign"] = [
            (await theirs.rpc(method, {"taskId": task_id, **extra}))["error"]
            for method, extra in methods
        ]
        found["unknown"] = [
            (await theirs.rpc(method, {"taskId": unknown, **extra}))["error"]
            for method, extra in methods
        ]
        found["still"] = (await other.rpc("tasks/get", {"taskId": task_id}))["result"]
        await other.rpc("tasks/cancel", {"taskId": task_id})

    mcp(stack, scenario)
    task_id = found["task"]
    assert without_ids(found["foreign"], task_id) == without_ids(found["unknown"], unknown)
    assert {error["code"] for error in found["foreign"]} == {INVALID_PARAMS}
    assert found["still"]["status"] == "working"  # B's cancel did nothing
    job = Job.objects.get(pk=task_id)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)


# -- ABP and JSON-RPC: resume, cancel, downloads ----------------------------------------


def test_another_users_session_cannot_be_resumed_even_with_its_token(stack: Stack) -> None:
    ann, bob = new_user(), new_user()
    with page_of(stack, ann) as page:
        page.initialize()
        session_id, token = page.session_id, page.resume_token
    assert token is not None
    # Pages have no key: only the session's user tells them apart.
    for stranger in (
        page_of(stack, bob),
        page_of(stack, None),
        Agent(stack.ws_url, key=key_of(bob)),
    ):
        with stranger:
            refused = stranger.resume(session_id, token)["payload"]["error"]
            assert refused["code"] == "SESSION_INVALID"
    with page_of(stack, ann) as again:
        resumed = again.resume(session_id, token)["payload"]
        assert resumed["sessionId"] == str(session_id)
        assert AgentSession.objects.get(pk=session_id).user_id == ann.pk


def test_a_cancel_names_a_call_of_its_own_session_only(stack: Stack) -> None:
    ann, bob = new_user(), new_user()
    with (
        Agent(stack.ws_url, key=key_of(ann)) as mine,
        Agent(stack.ws_url, key=key_of(bob)) as theirs,
        RpcAgent(rpc_url(stack.ws_url), key=key_of(ann)) as mine_rpc,
        RpcAgent(rpc_url(stack.ws_url), key=key_of(bob)) as theirs_rpc,
    ):
        for agent in (mine, theirs):
            agent.initialize()
        for rpc_agent in (mine_rpc, theirs_rpc):
            rpc_agent.start()
        call = mine.call("test.sleep", SHORT, call_id="shared")
        rpc_call = mine_rpc.call("test.sleep", SHORT, call_id="shared-rpc", request_id=7)
        wait_running(mine, "shared")

        refused = theirs.reply_to(theirs.cancel("shared"), "capabilities/cancel-result")
        assert refused["payload"] == {
            "callId": "shared",
            "cancelled": False,
            "reason": replies.NOT_FOUND,
        }
        theirs_rpc.response(theirs_rpc.cancel("shared-rpc"))
        theirs_rpc.cancel_request(7)  # the same request id, on B's connection

        assert mine.result_of(call)["payload"]["success"] is True
        assert mine_rpc.result(rpc_call)["data"]["steps"] == SHORT["steps"]
    for session_id, call_id in ((mine.session_id, "shared"), (mine_rpc.session_id, "shared-rpc")):
        job = Job.objects.get(session_id=session_id, call_id=call_id)
        assert (job.status, job.cancel_source) == (JobStatus.SUCCEEDED, "")


def test_a_download_link_cannot_be_made_from_a_job_id(stack: Stack) -> None:
    with Agent(stack.ws_url, key=key_of(new_user())) as agent:
        agent.initialize()
        done = agent.result_of(agent.call("test.sleep", {"steps": 1, "fileBytes": 300_000}))
        link = done["payload"]["data"]["file"]["downloadUrl"]
    job = Job.objects.get(session_id=agent.session_id)
    with urllib.request.urlopen(link) as response:  # the signed link itself: a capability URL
        assert response.status == 200
    filename = link.rsplit("/", 1)[1]
    for token in (str(job.id), job.id.hex):
        guessed = stack.http_url.rstrip("/") + reverse(
            "abp-download", kwargs={"token": token, "filename": filename}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(guessed)
        refused.value.close()
        assert refused.value.code == 403


# -- deactivating a user ----------------------------------------------------------------


def refusal_within(agent: Agent | RpcAgent, deadline: float) -> tuple[dict[str, Any], int]:
    """The refusal a connection was told before its close, and its close code; TimeoutError
    unless it closed by `deadline`."""
    with contextlib.suppress(ConnectionClosed):
        while True:
            agent.receive(timeout=max(0.01, deadline - time.monotonic()))
    refusals = [data for message in agent.inbox if (data := refusal_of(message)) is not None]
    assert len(refusals) == 1, agent.inbox[-5:]
    code = agent.ws.close_code
    assert code is not None
    return refusals[0], code


def refusal_of(message: dict[str, Any]) -> dict[str, Any] | None:
    """A refusal's error: ABP's `notifications/error`, JSON-RPC's error with a null id."""
    payload = message.get("payload") or {}
    if message.get("type") == "notification" and payload.get("event") == "notifications/error":
        data: dict[str, Any] = payload["data"]
        return data
    if "error" in message and message.get("id") is None and "method" not in message:
        error: dict[str, Any] = message["error"]["data"]
        return error
    return None


class McpCallInFlight:
    """An MCP session (2025 wire) with a long call in flight, on a thread of its own.

    Its GET stream is open (the server's way to the client, as long as the session
    lives). `running` once the call reports progress; then, told the bound's
    `deadline`, it reads the call's answers, waits for the GET stream's end, and asks
    again on the session.
    """

    def __init__(self, stack: Stack, key: str) -> None:
        self.url = f"{stack.http_url}/mcp"
        self.key = key
        self.running = threading.Event()
        self.deadline: float | None = None
        self.told = threading.Event()
        self.found: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(1)
        self._done = self._pool.submit(anyio.run, self._run)

    def tell(self, deadline: float) -> None:
        self.deadline = deadline
        self.told.set()

    def result(self) -> dict[str, Any]:
        try:
            self._done.result(timeout=60)
        finally:
            self._pool.shutdown()
        return self.found

    async def _run(self) -> None:
        async with httpx2.AsyncClient(timeout=30) as http, anyio.create_task_group() as tasks:
            session = RawSession(http, self.url, self.key)
            await session.open()
            self.found["session"] = uuid.UUID(hex=session.session_id)
            stream_ended = anyio.Event()
            tasks.start_soon(self._follow, http, session, stream_ended)
            params = {"name": "test.sleep", "arguments": LONG, "_meta": {"progressToken": 1}}
            async with session.request("call", "tools/call", params) as messages:
                async for message in messages:  # its first progress: the call runs
                    if message.get("method") == "notifications/progress":
                        break
                self.running.set()
                assert await anyio.to_thread.run_sync(self.told.wait, 30)
                assert self.deadline is not None
                with anyio.fail_after(self.deadline - time.monotonic()):
                    self.found["answers"] = [
                        message async for message in messages if message.get("id") == "call"
                    ]
                    await stream_ended.wait()
            self.found["closed"] = time.monotonic()
            later = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
            response = await http.post(self.url, headers=session.headers(), json=later)
            self.found["later"] = response.status_code

    async def _follow(
        self, http: httpx2.AsyncClient, session: RawSession, ended: anyio.Event
    ) -> None:
        headers = session.headers(Accept="text/event-stream")
        async with http.stream("GET", self.url, headers=headers) as stream:
            async for _ in stream.aiter_lines():
                pass
        ended.set()


def test_deactivating_a_user_closes_their_sessions_on_every_door_within_the_bound(
    stack: Stack,
) -> None:
    ann, bob = new_user(), new_user()
    key = key_of(ann)
    with (
        Agent(stack.ws_url, key=key) as agent,
        RpcAgent(rpc_url(stack.ws_url), key=key) as rpc_agent,
        Agent(stack.ws_url, key=key_of(bob)) as bystander,
    ):
        agent.initialize()
        rpc_agent.start()
        bystander.initialize()
        call = agent.call("test.sleep", LONG, call_id="in-flight")
        wait_running(agent, "in-flight")
        bystanders = bystander.call("test.sleep", SHORT, call_id="bob's")
        mcp = McpCallInFlight(stack, key)
        assert mcp.running.wait(30)

        deadline = deactivate(ann)
        mcp.tell(deadline)

        result = agent.result_of(call, timeout=max(0.01, deadline - time.monotonic()))["payload"]
        told, code = refusal_within(agent, deadline)
        rpc_told, rpc_code = refusal_within(rpc_agent, deadline)
        found = mcp.result()
        assert bystander.result_of(bystanders)["payload"]["success"] is True

    # A's call in flight: answered once, cancelled by an operator, and its work stopped.
    assert result["cancelled"] is True
    assert result["error"]["code"] == "CANCELLED"
    assert len(agent.results_for_call("in-flight")) == 1
    job = eventually(
        Job.objects.filter(
            session_id=agent.session_id, call_id="in-flight", stopped_at__isnull=False
        ).first
    )
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.OPERATOR)
    for data, close_code in ((told, code), (rpc_told, rpc_code)):
        assert data["details"] == {"reason": "user-inactive", "closeCode": 4403}
        assert close_code == 4403
    assert AgentSession.objects.get(pk=agent.session_id).close_reason == "user deactivated"
    # A's MCP call in flight: answered once, cancelled; its session closed, then gone.
    [answer] = found["answers"]
    assert answer["result"]["isError"] is True
    assert answer["result"]["structuredContent"]["error"]["code"] == "CANCELLED"
    assert found["closed"] <= deadline
    assert found["later"] in (401, 404)  # refused, or the session is not found
    mcp_row = eventually(
        AgentSession.objects.filter(pk=found["session"], closed_at__isnull=False).first
    )
    assert mcp_row.close_reason == "user deactivated"
    mcp_job = Job.objects.get(session_id=found["session"])
    assert (mcp_job.status, mcp_job.cancel_source) == (JobStatus.CANCELLED, CancelSource.OPERATOR)

    # Whatever A opens next is refused (at the handshake, or at the latest by the sweep).
    with Agent(stack.ws_url, key=key) as again:
        with contextlib.suppress(ConnectionClosed):
            again.send(
                "initialize",
                {"agent": {"name": "again", "version": "1"}, "protocolVersion": "0.1"},
            )
        data, close_code = refusal_within(
            again, time.monotonic() + user_deactivation.closed_within()
        )
    assert data["details"] == {"reason": "user-inactive", "closeCode": 4403}
    assert close_code == 4403


def deactivate(user: Any) -> float:
    """Deactivate `user` as the admin does (a save); the deadline of the bound."""
    started = time.monotonic()
    user.is_active = False
    user.save()
    return started + user_deactivation.closed_within()
