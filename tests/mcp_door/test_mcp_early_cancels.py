"""One MCP session's calls by request id: a cancel that overtakes its call is held for it."""

from __future__ import annotations

import anyio
import pytest

from capabilities.mcp_door.early_cancels import Overtaken, RequestTable
from capabilities.session.calls import Phase


def test_a_cancel_before_its_call_is_held_and_the_call_never_runs() -> None:
    table = RequestTable()
    table.cancel(7)
    assert table.phase_of(7) is Phase.CANCELLED_EARLY
    with pytest.raises(Overtaken), table.running(7):
        raise AssertionError("the call ran")
    assert table.phase_of(7) is None
    # Over: the same id again is a new call, and a late cancel holds nothing.
    table.cancel(7)
    assert table.phase_of(7) is None


def test_a_cancel_while_the_call_runs_cancels_its_scope() -> None:
    async def scenario() -> bool:
        table = RequestTable()
        with table.running("r-1") as scope:
            assert table.phase_of("r-1") is Phase.IN_FLIGHT
            table.cancel("r-1")
            await anyio.sleep(1)
        return scope.cancelled_caught

    assert anyio.run(scenario)


def test_tables_are_per_session_and_bounded() -> None:
    first, second = RequestTable(), RequestTable()
    first.cancel(1)
    assert second.phase_of(1) is None
    for request_id in range(20_000):
        first.cancel(f"many-{request_id}")
    assert first.phase_of(1) is None  # the oldest forgotten first
    assert first.phase_of("many-19999") is Phase.CANCELLED_EARLY
