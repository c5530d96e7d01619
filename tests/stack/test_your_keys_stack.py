"""A key made on "Your keys" works over /abp/ws with the Python client, for its owner;
revoked on the page, its call in flight is cancelled and its session closed."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from abp_jobs_client import ABPError, AsyncClient, CallCancelled
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from capabilities.models import AgentKey, AgentSession, CancelSource, Job, JobStatus
from tests.support.stack import Stack
from tests.support.waiting import eventually, eventually_async

KEY = re.compile(r"abp_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")
LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}  # about 10 s, unless cancelled


def running_job(session_id: str | None) -> Job | None:
    assert session_id is not None
    return Job.objects.filter(
        session_id=uuid.UUID(session_id), capability="test.sleep", status=JobStatus.RUNNING
    ).first()


def test_a_key_made_on_the_page_calls_and_revoking_it_there_closes_its_session(
    stack: Stack,
) -> None:
    user = get_user_model().objects.create_user(username=f"yk-{uuid.uuid4().hex[:10]}")
    page = Client(HTTP_HOST="127.0.0.1")
    page.force_login(user)
    made = page.post(reverse("abp-your-keys"), {"name": "stack agent", "reach": "all"})
    found = KEY.search(made.content.decode())
    assert found is not None
    plaintext = found.group()
    key = AgentKey.objects.get(owner=user)
    revoke = reverse("abp-revoke-key", args=[key.pk])

    async def scenario() -> tuple[str | None, CallCancelled]:
        async with AsyncClient(stack.ws_url, key=plaintext) as client:
            whoami = await client.call("test.whoami", {}, timeout=30)
            assert whoami.data == {"user": user.get_username()}
            long = asyncio.ensure_future(client.call("test.sleep", LONG))
            await eventually_async(lambda: running_job(client.session_id))
            revoked = await sync_to_async(page.post)(revoke)
            assert revoked.status_code == 302
            with pytest.raises(CallCancelled) as cancelled:
                await long
            return client.session_id, cancelled.value

    session_id, cancelled = asyncio.run(scenario())
    assert session_id is not None
    job = Job.objects.get(session_id=uuid.UUID(session_id), capability="test.sleep")
    assert (job.status, job.cancel_source, job.user_id) == (
        JobStatus.CANCELLED,
        CancelSource.OPERATOR,
        user.pk,
    )
    assert cancelled.code == "CANCELLED"
    assert eventually(
        lambda: AgentSession.objects.filter(pk=session_id, closed_at__isnull=False).exists()
    )

    async def connect_again() -> None:
        async with AsyncClient(stack.ws_url, key=plaintext):
            pass

    with pytest.raises(ABPError) as refused:
        asyncio.run(connect_again())
    assert refused.value.code == "PERMISSION_DENIED"
