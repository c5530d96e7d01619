"""A tool call while PostgreSQL restarts, in-process: its session row cannot be written,
or cannot be closed once the call is answered."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import mcp_types as types
from django.db import OperationalError

from capabilities.calls import start
from capabilities.mcp_door import sessions, tool_calls

PARAMS = types.CallToolRequestParams(name="convert.markdownToHtml", arguments={})
DOWN = OperationalError("terminating connection due to administrator command")


def _call() -> types.CallToolResult:
    with mock.patch.object(tool_calls, "principal_of", return_value=mock.Mock()):
        return asyncio.run(tool_calls._call(mock.Mock(), PARAMS))


def test_a_call_whose_session_row_cannot_be_written_is_refused_retryable() -> None:
    run = mock.AsyncMock()
    with (
        mock.patch.object(sessions, "session_for_call", mock.AsyncMock(side_effect=DOWN)),
        mock.patch.object(tool_calls, "_run", run),
    ):
        result = _call()
    assert result.is_error
    assert result.structured_content == {"error": start.NOT_QUEUED.to_json()}
    run.assert_not_called()


def test_an_answer_stands_when_its_session_row_cannot_be_closed() -> None:
    answered = types.CallToolResult(content=[], structured_content={"html": "<h1>x</h1>"})
    ended: list[Any] = []

    async def end_session(session_id: str) -> None:
        ended.append(session_id)
        raise DOWN

    with (
        mock.patch.object(
            sessions, "session_for_call", mock.AsyncMock(return_value=("s-1", True, None))
        ),
        mock.patch.object(tool_calls, "_run", mock.AsyncMock(return_value=answered)),
        mock.patch.object(sessions, "end_session", end_session),
    ):
        assert _call() is answered
    assert ended == ["s-1"]  # tried; the row is the reaper's now
