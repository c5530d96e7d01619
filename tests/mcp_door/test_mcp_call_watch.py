"""The MCP door's wait for a call's outcome, on Channels' in-memory layer (no stack), and
a call refused while the layer is out of reach."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import mcp_types as types
import pytest
import redis
from django.db import OperationalError
from django.test import override_settings

from capabilities.calls import answers, session_records, start
from capabilities.jobs import notes
from capabilities.mcp_door import call_watch, tool_calls
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


class _LayerAway:
    """A channel layer whose Redis is restarting."""

    async def new_channel(self, prefix: str) -> str:
        raise redis.ConnectionError("Connection closed by server.")


def test_a_watch_the_layer_cannot_set_up_is_refused_before_its_block() -> None:
    async def scenario() -> None:
        async with call_watch.watching(str(uuid.uuid4())):
            raise AssertionError("the block ran")

    with (
        mock.patch.object(call_watch, "get_channel_layer", _LayerAway),
        pytest.raises(call_watch.CannotWatch),
    ):
        asyncio.run(scenario())


def test_a_tool_call_that_cannot_be_watched_is_refused_retryable_and_never_started() -> None:
    # Redis restarting: the coded refusal a call whose row cannot be written gets, not
    # a bare "Internal server error"; nothing is stored, so the client may call again.
    ctx = mock.Mock(request_id=7, meta={})
    params = types.CallToolRequestParams(name="convert.markdownToHtml", arguments={})
    start_for_caller = mock.AsyncMock()
    with (
        mock.patch.object(call_watch, "get_channel_layer", _LayerAway),
        mock.patch.object(answers, "start_for_caller", start_for_caller),
    ):
        session_id = str(uuid.uuid4())
        result = asyncio.run(tool_calls._run(ctx, params, mock.Mock(), session_id, None))
    assert result.is_error
    assert result.structured_content == {"error": start.NOT_QUEUED.to_json()}
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert "could not be queued; try again" in text.text
    start_for_caller.assert_not_called()
