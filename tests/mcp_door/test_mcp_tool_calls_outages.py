"""A tool call while PostgreSQL restarts, in-process: its session row cannot be written,
or cannot be closed once the call is answered (the row's writes raise as a restart makes
them; mcp_door/sessions.py turns them into the refusal, or leaves the row to the reaper)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from unittest import mock

import mcp_types as types
from django.db import OperationalError

from capabilities.calls import answers, session_records, start
from capabilities.mcp_door import sdk_seams, sessions, tasks_extension, tool_calls

PARAMS = types.CallToolRequestParams(name="convert.markdownToHtml", arguments={})
DOWN = OperationalError("terminating connection due to administrator command")


def _call() -> types.CallToolResult:
    with mock.patch.object(tool_calls, "principal_of", return_value=mock.Mock()):
        return asyncio.run(tool_calls._call(mock.Mock(), PARAMS))


def _no_connection() -> Any:
    return mock.patch.object(sdk_seams, "connection_of", return_value=None)  # 2026-07-28


def test_a_call_whose_session_row_cannot_be_written_is_refused_retryable() -> None:
    run = mock.AsyncMock()
    with (
        _no_connection(),
        mock.patch.object(sessions, "_write_per_call", side_effect=DOWN),
        mock.patch.object(session_records, "close_session", side_effect=DOWN),
        mock.patch.object(tool_calls, "_run", run),
    ):
        result = _call()
    assert result.is_error
    assert result.structured_content == {"error": start.NOT_QUEUED.to_json()}
    run.assert_not_called()


def test_an_answer_stands_when_its_session_row_cannot_be_closed() -> None:
    answered = types.CallToolResult(content=[], structured_content={"html": "<h1>x</h1>"})
    ended: list[Any] = []

    def close_session(session_id: str, reason: str) -> None:
        ended.append(session_id)
        raise DOWN

    with (
        _no_connection(),
        mock.patch.object(sessions, "_write_per_call"),
        mock.patch.object(uuid, "uuid4", return_value=uuid.UUID(int=1)),
        mock.patch.object(tool_calls, "_run", mock.AsyncMock(return_value=answered)),
        mock.patch.object(session_records, "close_session", close_session),
    ):
        assert _call() is answered
    assert ended == [str(uuid.UUID(int=1))]  # tried; the row is the reaper's now


def test_a_task_whose_session_row_cannot_be_written_is_refused_as_a_plain_call_is() -> None:
    start_for_caller = mock.AsyncMock()
    with (
        _no_connection(),
        mock.patch.object(tool_calls, "principal_of", return_value=mock.Mock()),
        mock.patch.object(sessions, "_write_per_call", side_effect=DOWN),
        mock.patch.object(session_records, "close_session", side_effect=DOWN),
        mock.patch.object(answers, "start_for_caller", start_for_caller),
    ):
        result = asyncio.run(tasks_extension.start_task(mock.Mock(), PARAMS))
    assert isinstance(result, types.CallToolResult)
    assert result.structured_content == {"error": start.NOT_QUEUED.to_json()}
    start_for_caller.assert_not_called()
