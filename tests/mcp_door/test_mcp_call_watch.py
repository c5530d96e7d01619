"""The MCP door's wait for a call's outcome, on Channels' in-memory layer (no stack)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import override_settings

from capabilities.calls import session_records
from capabilities.jobs import notes
from capabilities.mcp_door import call_watch
from capabilities.models import Job, session_group

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def in_memory_layer() -> Iterator[None]:
    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        yield


@pytest.mark.usefixtures("database")
def test_the_wait_outlasts_a_database_that_is_restarting() -> None:
    session_id = str(uuid.uuid4())
    job = Job(id=uuid.uuid4(), call_id="c-1")
    answer = {"callId": "c-1", "success": True, "data": {}}
    claims: list[Any] = []

    def claim_response(job_id: str, base_url: str, response: Any, **_: Any) -> Any:
        claims.append(response)
        if len(claims) == 1:  # PostgreSQL restarting: the first read fails
            raise OperationalError("terminating connection due to administrator command")
        return answer

    async def scenario() -> dict[str, Any]:
        async with call_watch.watching(session_id) as watch:
            await watch._layer.group_send(session_group(session_id), notes.job_settled("c-1"))
            return await watch.outcome(job, base_url="http://testserver")

    with (
        mock.patch.object(session_records, "claim_response", claim_response),
        mock.patch.object(call_watch, "QUIET_SECONDS", 0.05),
    ):
        assert asyncio.run(scenario()) == answer
    assert len(claims) == 2  # read again once the wait came round, not raised to the client
