"""The connection's life over the real stack: frames, initialize, shutdown, disconnect."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Frame
from websockets.http11 import Response
from websockets.uri import parse_uri

from capabilities.endings import resumption
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_stopped
from tests.support.stack import Stack
from tests.support.waiting import eventually, seconds_between


def test_initialize_result(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        reply = agent.initialize(notifications=True)
        payload = reply["payload"]
        assert payload["protocolVersion"] == "0.1"
        assert payload["app"]["id"] == "abp-jobs"
        names = [c["name"] for c in payload["capabilities"]]
        assert "export.pdf" in names
        assert all(c["available"] is True for c in payload["capabilities"])
        assert payload["features"]["notifications"] is True
        assert isinstance(reply["timestamp"], int)
        session = AgentSession.objects.get(pk=payload["sessionId"])
        assert session.agent_name == "test-agent"


def test_second_initialize_is_refused(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        first = agent.initialize()
        again = agent.send("initialize", {"agent": {"name": "x"}})
        reply = agent.reply_to(again, "initialize-result")
        assert reply["payload"]["error"]["code"] == "ALREADY_INITIALIZED"
        assert first["payload"]["sessionId"]


def test_call_before_initialize_is_refused(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        call = agent.call("test.sleep", {})
        payload = agent.result_of(call)["payload"]
        assert payload["success"] is False
        assert payload["error"]["code"] == "NOT_INITIALIZED"
        shutdown = agent.send("shutdown", {})
        note = agent.wait_for(lambda e: e["type"] == "notification")
        assert note["payload"]["data"]["code"] == "NOT_INITIALIZED"
        assert note["payload"]["data"]["requestId"] == shutdown


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "PARSE_ERROR"),
        ("[1, 2]", "PARSE_ERROR"),
        (b"\xff\xfe binary garbage", "PARSE_ERROR"),
        (json.dumps({"type": "no/such", "id": "1"}), "UNKNOWN_MESSAGE_TYPE"),
        (json.dumps({"type": "capabilities/cancel", "id": "1"}), "MISSING_PARAM"),
        (json.dumps({"type": "shutdown", "id": "1", "payload": []}), "INVALID_TYPE"),
    ],
)
def test_bad_frames_get_a_coded_error_and_the_connection_stays(
    stack: Stack, frame: str | bytes, code: str
) -> None:
    with Agent(stack.ws_url) as agent:
        agent.initialize()
        agent.send_raw(frame)
        reply = agent.wait_for(
            lambda e: e["type"] in ("notification", "capabilities/cancel-result")
        )
        error = reply["payload"].get("error") or reply["payload"]["data"]
        assert error["code"] == code
        # Still open and usable.
        call = agent.call("test.sleep", {"steps": 0})
        assert agent.result_of(call)["payload"]["success"] is True


def test_oversized_frame_closes_with_1009(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        agent.initialize()
        agent.send_raw("x" * (1024 * 1024 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            agent.receive(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009


def test_shutdown_answers_every_call_then_closes(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        agent.initialize()
        calls = [
            agent.call("test.sleep", {"steps": 500, "stepMs": 20}, call_id=f"s{n}")
            for n in range(3)
        ]
        eventually(
            lambda: Job.objects.filter(
                session_id=agent.session_id, status=JobStatus.RUNNING
            ).exists()
        )
        agent.send("shutdown", {"reason": "done for today"})
        for call in calls:
            assert agent.result_of(call)["payload"]["cancelled"] is True
        with pytest.raises(ConnectionClosed) as closed:
            agent.receive(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1000
        session_id = agent.session_id
    jobs = Job.objects.filter(session_id=session_id)
    assert {j.cancel_source for j in jobs} == {CancelSource.SHUTDOWN}
    for n in range(3):
        assert len(agent.results_for_call(f"s{n}")) == 1
    session = AgentSession.objects.get(pk=session_id)
    assert session.close_reason == "shutdown: done for today"
    assert session.closed_at is not None


def test_a_session_nobody_resumes_has_its_calls_cancelled(stack: Stack) -> None:
    agent = Agent(stack.ws_url)
    agent.initialize()
    # Still running when the grace period ends.
    steps = int(resumption.grace().total_seconds() * 50) + 500
    agent.call("test.sleep", {"steps": steps, "stepMs": 20}, call_id="gone")
    eventually(
        lambda: Job.objects.filter(session_id=agent.session_id, status=JobStatus.RUNNING).exists()
    )
    agent.close()
    job = wait_stopped(agent, "gone", timeout=resumption.grace().total_seconds() + 10)
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.DISCONNECT
    assert not job.hard_killed
    session = eventually(
        lambda: AgentSession.objects.filter(pk=agent.session_id, closed_at__isnull=False).first()
    )
    assert session.close_reason == resumption.EXPIRED_REASON
    # By the periodic task, once the grace period ended: not at the disconnect.
    assert job.settled_at is not None
    assert session.detached_at is not None
    assert seconds_between(session.detached_at, job.settled_at) >= resumption.grace().seconds


def test_a_slow_client_reads_its_refusal_and_closes_cleanly(stack: Stack) -> None:
    """A client that reads late still gets the notice, and the close handshake completes.

    Autobahn drops a connection whose client has not answered our close within 1 s; a
    client busy for longer then replies to a dropped socket, and a client library can
    lose the frames it read with the close (websockets does), the notice among them.
    """
    client = ClientProtocol(parse_uri(stack.ws_url))
    request = client.connect()
    request.headers["Authorization"] = "Bearer abp_0000000000_" + "x" * 43
    client.send_request(request)
    with socket.create_connection(("127.0.0.1", stack.web_port), timeout=10) as sock:
        sock.sendall(b"".join(client.data_to_send()))
        time.sleep(2.0)  # busy, past autobahn's default wait for the close's answer
        received = sock.recv(65536)  # a reset here: the server gave up on us
        client.receive_data(received)
        response, notice_frame, close_frame = client.events_received()
        assert isinstance(response, Response)
        assert response.status_code == 101
        assert isinstance(notice_frame, Frame)
        assert isinstance(close_frame, Frame)
        notice = json.loads(bytes(notice_frame.data))
        assert notice["payload"]["data"]["details"]["reason"] == "invalid-credentials"
        assert Close.parse(bytes(close_frame.data)).code == 4401
        sock.sendall(b"".join(client.data_to_send()))  # our answer to the close
        with contextlib.suppress(ConnectionResetError):  # then the server drops TCP
            assert sock.recv(65536) == b""
