"""A client's cancel racing its call's start, on both MCP wires, never runs a job for nobody.

An export is sent and let go of 0-15 ms later, hundreds of times: on 2025-11-25 by a
`notifications/cancelled`, on 2026-07-28 by closing the call's stream (raw HTTP,
so that the delay runs from the request's sending). Each
cancel lands somewhere in the call's start: before the session row, during the
job's insert, during the hand-over to Celery, or once the job runs. Whatever the
moment, every job written must end cancelled by its agent, the work never finished,
and no session row may be left open. `ABP_RACE_CANCELS` and `ABP_RACE_MAX_MS` set
the count and the window (docs/testing.md).
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx2
import pytest

from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus
from tests.support.mcp_clients import RawModern, RawSession, suite_key
from tests.support.stack import Stack
from tests.support.waiting import eventually, in_thread

pytestmark = pytest.mark.usefixtures("database")

CANCELS = int(os.environ.get("ABP_RACE_CANCELS", "150"))
MAX_MS = float(os.environ.get("ABP_RACE_MAX_MS", "15"))
# Twenty pages: about a second of work, so a job that ran for nobody finishes and shows.
PAGES = "".join(
    f"<section style='page-break-after: always'><h1>{n}</h1>{'<p>text</p>' * 20}</section>"
    for n in range(20)
)


def _jobs_since(since: datetime) -> list[Job]:
    return list(Job.objects.filter(session__door=Door.MCP, created_at__gte=since))


def _none_active(since: datetime) -> bool:
    return not any(job.is_active for job in _jobs_since(since))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_cancels_racing_the_start_leave_no_job_running_and_no_session_open(
    stack: Stack, mode: str
) -> None:
    since = datetime.now(tz=UTC)
    delays = random.Random(f"{mode}-{CANCELS}").choices(range(int(MAX_MS * 10) + 1), k=CANCELS)
    url = f"{stack.http_url}/mcp"
    race = _race_on_2025 if mode == "legacy" else _race_on_2026
    answers = anyio.run(race, url, since, [tenths / 10_000 for tenths in delays])
    # Exactly one answer per request: the cancel's (-32800) or, never here, a result.
    assert all(len(answer) <= 1 for answer in answers), answers
    assert not [a for answer in answers for a in answer if "result" in a], "a call finished"

    jobs = _jobs_since(since)
    # How far the calls got before their cancel (shown with -s; docs/testing.md).
    print(f"{mode}: {len(delays)} cancels, {len(jobs)} jobs written")
    # 0 jobs ran for nobody: every job written was cancelled, by its agent.
    assert [job.status for job in jobs if job.status != JobStatus.CANCELLED] == []
    assert {job.cancel_source for job in jobs} <= {CancelSource.AGENT}
    # One outcome each, claimed once: the cancel's.
    assert [job.id for job in jobs if job.delivered_at is None] == []

    def work_stopped() -> bool:
        started = Job.objects.filter(pk__in=[job.id for job in jobs], started_at__isnull=False)
        return not started.filter(stopped_at__isnull=True).exists()

    assert eventually(work_stopped, timeout=15)
    # The client has gone, and its session with it: no row of this test is left open.
    open_rows = AgentSession.objects.filter(
        door=Door.MCP, connected_at__gte=since, closed_at__isnull=True
    )
    assert eventually(lambda: not open_rows.exists(), timeout=15), list(open_rows)


async def _race_on_2025(url: str, since: datetime, delays: list[float]) -> list[list[Any]]:
    """Raw HTTP: each call's `notifications/cancelled` is sent `delay` after the call."""
    answers: list[list[Any]] = []
    async with httpx2.AsyncClient(timeout=30) as http:
        session = RawSession(http, url, suite_key())
        await session.open()
        for request_id, delay in enumerate(delays, start=1):
            answer: list[Any] = []
            answers.append(answer)
            async with anyio.create_task_group() as group:

                async def call(request_id: int = request_id, answer: list[Any] = answer) -> None:
                    params = {"name": "export.pdf", "arguments": {"html": PAGES}}
                    async with session.request(request_id, "tools/call", params) as events:
                        answer.extend([event async for event in events if "id" in event])

                group.start_soon(call)
                await anyio.sleep(delay)
                await session.notify("notifications/cancelled", {"requestId": request_id})
        await _until_settled(since)
        await session.close()
    return answers


async def _race_on_2026(url: str, since: datetime, delays: list[float]) -> list[list[Any]]:
    """Raw HTTP, session-less: each call's stream is closed `delay` after the call."""
    answers: list[list[Any]] = []
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawModern(http, url, suite_key(), tasks=False)
        params = {"name": "export.pdf", "arguments": {"html": PAGES}}
        for delay in delays:
            answer: list[Any] = []
            answers.append(answer)
            with anyio.move_on_after(delay):
                answer.append(await client.rpc("tools/call", params))
        await _until_settled(since)
    return answers


async def _until_settled(since: datetime) -> None:
    """Until every job of the race settled (one that ran for nobody has finished by then)."""
    await anyio.sleep(0.5)  # a start still on its way is written by then
    with anyio.fail_after(60):
        while not await in_thread(lambda: _none_active(since)):  # noqa: ASYNC110 (the DB)
            await anyio.sleep(0.05)
