"""The Python client (clients/python, abp_jobs_client) against the real stack."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import uuid
from typing import Any

import pytest
from abp_jobs_client import (
    ABPError,
    AsyncClient,
    Blob,
    CallCancelled,
    CallTimedOut,
    Client,
    Disconnected,
    InvalidParams,
    Progress,
    RetryPolicy,
    Unavailable,
)
from asgiref.sync import sync_to_async
from PIL import Image

from capabilities.models import CancelSource, Job, JobStatus
from tests.support.stack import Stack, free_port
from tests.support.waiting import eventually

LONG = {"steps": 150, "stepMs": 20}  # about 3 s


def key() -> str:
    return os.environ["ABP_TEST_AGENT_KEY"]


def job_of(session_id: str | None, call_id: str, **status: Any) -> Job | None:
    assert session_id is not None
    return Job.objects.filter(session_id=uuid.UUID(session_id), call_id=call_id, **status).first()


async def running(client: AsyncClient, call_id: str) -> Job:
    """The call's job once a worker runs it (waited for off the client's event loop)."""

    def probe() -> Job | None:
        return job_of(client.session_id, call_id, status=JobStatus.RUNNING)

    job: Job = await sync_to_async(eventually)(probe, 30)
    return job


def test_the_blocking_client_lists_capabilities_with_schemas_and_calls(stack: Stack) -> None:
    with Client(stack.ws_url, key=key()) as client:
        listed = {entry["name"]: entry for entry in client.capabilities()}
        assert listed["export.pdf"]["inputSchema"]["type"] == "object"
        result = client.call("convert.markdownToHtml", {"markdown": "# Hi"}, timeout=30)
    assert "<h1" in result.data["html"]
    assert result.duration_ms is not None


def test_progress_reaches_the_callback_with_its_stage(stack: Stack) -> None:
    seen: list[Progress] = []

    async def scenario() -> None:
        async with AsyncClient(stack.ws_url, key=key()) as client:
            result = await client.call(
                "test.sleep", {"steps": 5, "stepMs": 20, "echo": "p"}, on_progress=seen.append
            )
            assert result.data["echo"] == "p"

    asyncio.run(scenario())
    assert [p.progress for p in seen if p.stage == "sleeping"][-1] == 5
    assert all(p.call_id == seen[0].call_id for p in seen)


def test_cancel_returns_the_confirmation_then_the_call_raises_cancelled(stack: Stack) -> None:
    async def scenario() -> tuple[dict[str, Any], CallCancelled, str | None, float | None]:
        async with AsyncClient(stack.ws_url, key=key()) as client:
            handle = await client.start("test.sleep", LONG, call_id="to-cancel")
            await running(client, "to-cancel")
            confirmation = await handle.cancel("changed my mind")
            with pytest.raises(CallCancelled) as raised:
                await handle
            return confirmation, raised.value, client.session_id, handle.confirmed_in_ms

    confirmation, error, session_id, confirmed_in = asyncio.run(scenario())
    assert (confirmation["callId"], confirmation["cancelled"]) == ("to-cancel", True)
    assert error.code == "CANCELLED"
    assert confirmed_in is not None
    job = eventually(lambda: job_of(session_id, "to-cancel", stopped_at__isnull=False))
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.AGENT)


def test_cancelling_the_awaiting_task_cancels_the_call_on_the_server(stack: Stack) -> None:
    async def scenario() -> str | None:
        async with AsyncClient(stack.ws_url, key=key()) as client:
            task = asyncio.create_task(client.call("test.sleep", LONG, call_id="task-cancel"))
            await running(client, "task-cancel")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Confirmed before the task ended: the job is settled already.
            job = await sync_to_async(job_of)(client.session_id, "task-cancel")
            assert job is not None
            assert job.status == JobStatus.CANCELLED
            return client.session_id

    session_id = asyncio.run(scenario())
    job = eventually(lambda: job_of(session_id, "task-cancel", stopped_at__isnull=False))
    assert job.cancel_source == CancelSource.AGENT


def test_a_timeout_cancels_on_the_server_and_raises_timed_out(stack: Stack) -> None:
    with Client(stack.ws_url, key=key()) as client:
        with pytest.raises(CallTimedOut) as raised:
            client.call("test.sleep", LONG, timeout=0.3)
        [call] = Job.objects.filter(session__pk=str(client.session_id))
    assert raised.value.code == "TIMEOUT"
    job = eventually(lambda: job_of(client.session_id, call.call_id, stopped_at__isnull=False))
    assert job.cancel_source == CancelSource.TIMEOUT


def test_errors_are_typed_with_their_code_retryable_and_details(stack: Stack) -> None:
    with Client(stack.ws_url, key=key()) as client:
        with pytest.raises(InvalidParams) as invalid:
            client.call("export.pdf", {"html": 5})
        with pytest.raises(ABPError) as unknown:
            client.call("no.such", {})
    assert invalid.value.code in {"INVALID_TYPE", "INVALID_PARAMS"}
    assert invalid.value.details["path"].startswith("params.html")
    assert invalid.value.retryable is False
    assert unknown.value.code == "UNKNOWN_CAPABILITY"


def test_retryable_errors_are_retried_by_the_policy_then_raised(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = {
        "ABP_CAPABILITY_QUEUES": "test.sleep=abp.nobody",
        "ABP_UNAVAILABLE_RETRY_AFTER_MS": "20",
    }
    caplog.set_level(logging.INFO, logger="abp_jobs_client.client")
    with stack.another_web("daphne-client-retry", nowhere) as where:
        client = Client(f"ws://{where}/abp/ws", key=key(), retry=RetryPolicy(attempts=3))
        with client, pytest.raises(Unavailable) as raised:
            client.call("test.sleep", {"steps": 0})
    assert raised.value.retryable is True
    assert raised.value.retry_after_ms == 20
    retries = [r for r in caplog.records if "CAPABILITY_UNAVAILABLE; attempt" in r.getMessage()]
    assert len(retries) == 2


def test_a_dropped_socket_is_resumed_and_the_result_arrives_once(stack: Stack) -> None:
    async def scenario() -> tuple[str | None, str | None, Any]:
        async with AsyncClient(stack.ws_url, key=key()) as client:
            first_session = client.session_id
            handle = await client.start("test.sleep", {"steps": 50, "stepMs": 20, "echo": "kept"})
            await running(client, handle.call_id)
            old = client._ws
            assert old is not None
            old.transport.abort()  # the network drops: no close frame
            result = await handle
            assert client._ws is not old
            # The session goes on: another call on the new socket.
            after = await client.call("test.sleep", {"steps": 1, "echo": "after"})
            assert after.data["echo"] == "after"
            return first_session, client.session_id, result.data

    first, resumed, data = asyncio.run(scenario())
    assert first == resumed
    assert data["echo"] == "kept"
    assert resumed is not None
    job = Job.objects.get(session_id=uuid.UUID(resumed), params__echo="kept")
    assert job.status == JobStatus.SUCCEEDED
    assert job.delivered_at is not None


def test_binary_inputs_upload_and_binary_results_come_back_as_bytes(stack: Stack) -> None:
    picture = io.BytesIO()
    Image.effect_noise((600, 400), 60).convert("RGB").save(picture, "PNG")
    assert len(picture.getvalue()) > 64 * 1024  # goes through the upload route
    with Client(stack.ws_url, key=key()) as client:
        small = client.call(
            "process.image",
            {
                "image": Blob(picture.getvalue(), "image/png"),
                "operations": [{"type": "resize", "width": 60, "height": 40}],
                "format": "jpeg",
            },
        )
        linked = client.call("test.sleep", {"steps": 0, "fileBytes": 300 * 1024})
        session_id = client.session_id
    image = small.data["image"]
    assert isinstance(image, Blob)
    assert Image.open(io.BytesIO(image.content)).size == (60, 40)
    assert session_id is not None
    job = Job.objects.get(session_id=uuid.UUID(session_id), capability="process.image")
    assert "uploadId" in job.params["image"]
    file = linked.data["file"]
    assert isinstance(file, Blob)
    assert len(file.content) == 300 * 1024


def test_a_call_over_the_frame_limit_is_refused_before_anything_is_sent(stack: Stack) -> None:
    with Client(stack.ws_url, key=key(), max_frame_bytes=1024 * 1024) as client:
        with pytest.raises(InvalidParams) as raised:
            client.call("export.pdf", {"html": "x" * (1024 * 1024)})
        assert raised.value.details["limit"] == 1024 * 1024
        assert not Job.objects.filter(session__pk=str(client.session_id)).exists()
        # The session goes on.
        assert client.call("test.sleep", {"steps": 0, "echo": 1}).data["echo"] == 1


def test_a_frame_the_server_refuses_ends_the_calls_with_disconnected_not_a_hang(
    stack: Stack,
) -> None:
    # The stack's Daphnes take frames of at most 1 MiB; this client was told 64 MiB.
    client = Client(stack.ws_url, key=key(), max_frame_bytes=64 * 1024 * 1024)
    with client, pytest.raises(Disconnected) as raised:
        client.start("export.pdf", {"html": "x" * (2 * 1024 * 1024)}).result(timeout=30)
    assert "1009" in raised.value.message


def test_a_refused_key_raises_a_typed_error_when_opening(stack: Stack) -> None:
    with pytest.raises(ABPError) as raised, Client(stack.ws_url, key="abp_not-a-key"):
        pass
    assert raised.value.code == "PERMISSION_DENIED"
    assert raised.value.retryable is False


def test_no_server_raises_a_retryable_transport_error() -> None:
    with pytest.raises(ABPError) as raised, Client(f"ws://127.0.0.1:{free_port()}/abp/ws"):
        pass
    assert (raised.value.code, raised.value.retryable) == ("TRANSPORT_ERROR", True)
