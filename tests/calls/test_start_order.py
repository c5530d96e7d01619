"""A session's calls start at once, and are still written in the order they were sent.

The turns alone (calls/start_order.py), then a burst on the real stack: every row of
a burst of calls sent at once, in one session, is created in the order of the frames.
"""

from __future__ import annotations

import asyncio

from capabilities.calls.start_order import StartOrder
from capabilities.models import Job
from tests.support.agent import Agent


async def _take_turns(delays: list[float], cancel: int | None = None) -> list[int]:
    order = StartOrder()
    handed: list[int] = []

    async def start(n: int, delay: float) -> None:
        turn = order.turn()
        try:
            await asyncio.sleep(delay)  # a later call may be ready first
            await turn.come()
            handed.append(n)
        finally:
            turn.pass_on()

    tasks = [asyncio.create_task(start(n, delay)) for n, delay in enumerate(delays)]
    if cancel is not None:
        await asyncio.sleep(0)
        tasks[cancel].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return handed


def test_each_start_hands_its_row_over_after_the_one_before_it() -> None:
    assert asyncio.run(_take_turns([0.03, 0.0, 0.02, 0.0, 0.01])) == [0, 1, 2, 3, 4]


def test_a_start_that_gives_up_lets_the_next_one_go() -> None:
    assert asyncio.run(_take_turns([0.05, 0.0, 0.0], cancel=0)) == [1, 2]


def test_a_burst_of_calls_in_one_session_is_written_in_the_order_sent(agent: Agent) -> None:
    call_ids = [f"burst-{n}" for n in range(60)]
    calls = [
        agent.call("convert.markdownToHtml", {"markdown": f"# {n}"}, call_id=call_id)
        for n, call_id in enumerate(call_ids)
    ]
    for call in calls:
        assert agent.result_of(call)["payload"]["success"] is True
    written = Job.objects.filter(session_id=agent.session_id, call_id__in=call_ids).order_by(
        "created_at"
    )
    assert [job.call_id for job in written] == call_ids
