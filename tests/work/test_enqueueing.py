"""`.enqueue()` from the work's side: the `Capability` a decorator returns, the handle,
and the port they call, here an in-memory twin (no database, no worker).

What the app's port does with a call (its checks, its rows) is in
tests/calls/test_app_calls.py; a real worker running what it stores, in
tests/stack/test_enqueue_stack.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from capabilities import (
    CapabilityError,
    EnqueueRefused,
    JobContext,
    JobHandle,
    JobNotFound,
    capability,
)
from capabilities.protocol import ErrorCode, WireError
from capabilities.work import enqueueing, registry
from capabilities.work.declared import Capability

NAME = "test.enqueued"


@dataclass
class Order:
    count: int
    label: str = "x"


@dataclass
class Total:
    total: int


def signed_in(pk: int) -> Any:
    """A user as `enqueue` reads one (signed in, with a primary key), never saved."""
    return get_user_model()(pk=pk)


class TwinCalls:
    """The port, in memory: jobs in a dict, bound to their user as the real one binds."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobHandle] = {}
        self.enqueued: list[tuple[str, dict[str, Any], Any, int | None]] = []
        self.cancels: list[tuple[str, int | None]] = []
        self.refusal: WireError | None = None

    def enqueue(
        self, capability: str, params: dict[str, Any], *, user: Any, timeout_ms: int | None
    ) -> JobHandle:
        if self.refusal is not None:
            raise EnqueueRefused(self.refusal)
        self.enqueued.append((capability, params, user, timeout_ms))
        job_id = f"job-{len(self.jobs) + 1}"
        user_id = enqueueing.user_id_of(user)
        self.jobs[job_id] = JobHandle(
            id=job_id, capability=capability, status="queued", user_id=user_id
        )
        return self.jobs[job_id]

    async def aenqueue(
        self, capability: str, params: dict[str, Any], *, user: Any, timeout_ms: int | None
    ) -> JobHandle:
        return self.enqueue(capability, params, user=user, timeout_ms=timeout_ms)

    def find(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle:
        job = self.jobs.get(job_id)
        if job is None or job.capability != capability or job.user_id != user_id:
            raise JobNotFound(job_id)
        return replace(job)

    async def afind(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle:
        return self.find(capability, job_id, user_id=user_id)

    def cancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool:
        job = self.find(capability, job_id, user_id=user_id)
        self.cancels.append((job_id, user_id))
        if job.is_finished:
            return False
        error = WireError(code=ErrorCode.CANCELLED, message="Cancelled by its user.")
        self.jobs[job_id] = replace(job, status="cancelled", error=error)
        return True

    async def acancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool:
        return self.cancel(capability, job_id, user_id=user_id)


@pytest.fixture
def twin() -> Iterator[TwinCalls]:
    calls = TwinCalls()
    previous = enqueueing.install(calls)
    try:
        yield calls
    finally:
        enqueueing.install(previous)
        registry.unregister(NAME)


def declared() -> Capability[[Order, JobContext], Total]:
    @capability(NAME, description="Counts.", timeout_ms=5_000)
    def count(params: Order, ctx: JobContext) -> Total:
        """Twice the count."""
        return Total(total=params.count * 2)

    return count


def test_the_decorated_name_is_still_the_function(twin: TwinCalls) -> None:
    count = declared()
    assert count(Order(count=2), None) == Total(total=4)  # type: ignore[arg-type]
    assert count.__name__ == "count"
    assert count.__doc__ == "Twice the count."
    assert count.name == NAME
    assert list(inspect.signature(count).parameters) == ["params", "ctx"]
    assert registry.require(NAME).runner.__qualname__.endswith("count")  # type: ignore[union-attr]


def test_enqueue_hands_the_port_json_params_and_returns_its_handle(twin: TwinCalls) -> None:
    count = declared()
    ann = signed_in(7)
    job = count.enqueue(Order(count=3), user=ann, timeout_ms=1_000)
    assert twin.enqueued == [(NAME, {"count": 3, "label": "x"}, ann, 1_000)]
    assert (job.capability, job.status, job.user_id, job.is_finished) == (
        NAME,
        "queued",
        7,
        False,
    )
    count.enqueue({"count": 4})
    assert twin.enqueued[-1] == (NAME, {"count": 4}, None, None)


def test_a_plain_dict_capability_takes_only_a_mapping(twin: TwinCalls) -> None:
    @capability(
        NAME,
        description="Plain.",
        input_schema={"type": "object"},
        output_schema={"type": "object"},
    )
    def plain(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return params

    with pytest.raises(TypeError, match="takes its params as a dict"):
        plain.enqueue(Order(count=1))
    assert not twin.enqueued


def test_a_refusal_is_the_agents_code_and_a_capability_error(twin: TwinCalls) -> None:
    count = declared()
    twin.refusal = WireError(
        code=ErrorCode.RATE_LIMITED,
        message="At most 1 calls of yours may be queued.",
        retry_after_ms=500,
        details={"limit": "callsInFlight", "max": 1},
    )
    with pytest.raises(CapabilityError) as refused:
        count.enqueue(Order(count=1), user=signed_in(1))
    assert isinstance(refused.value, EnqueueRefused)
    assert refused.value.code == "RATE_LIMITED"
    assert refused.value.retryable is True  # the code's default, as on the wire
    assert refused.value.retry_after_ms == 500
    assert refused.value.details == {"limit": "callsInFlight", "max": 1}
    assert not twin.jobs


def test_refresh_reads_the_job_again_in_place_bound_to_its_user(twin: TwinCalls) -> None:
    count = declared()
    job = count.enqueue(Order(count=3), user=signed_in(7))
    twin.jobs[job.id] = replace(twin.jobs[job.id], status="succeeded", result={"total": 6})
    job.refresh()
    assert (job.status, job.result, job.is_finished) == ("succeeded", {"total": 6}, True)
    assert count.get_result(job.id, user=signed_in(7)).result == {"total": 6}
    for stranger in (signed_in(8), None, AnonymousUser()):
        with pytest.raises(JobNotFound):
            count.get_result(job.id, user=stranger)


def test_an_anonymous_user_starts_a_job_for_nobody(twin: TwinCalls) -> None:
    count = declared()
    job = count.enqueue(Order(count=1), user=AnonymousUser())
    assert job.user_id is None
    assert count.get_result(job.id).id == job.id


def test_cancel_goes_to_the_port_then_refreshes(twin: TwinCalls) -> None:
    count = declared()
    job = count.enqueue(Order(count=3), user=signed_in(7))
    assert job.cancel() is True
    assert job.status == "cancelled"
    assert job.error is not None
    assert job.error.code == "CANCELLED"
    assert job.cancel() is False  # settled already: nothing changes
    assert twin.cancels == [(job.id, 7), (job.id, 7)]


def test_the_async_twins_do_the_same(twin: TwinCalls) -> None:
    count = declared()

    async def scenario() -> JobHandle:
        job = await count.aenqueue(Order(count=5), user=signed_in(3))
        again = await count.aget_result(job.id, user=signed_in(3))
        assert again.id == job.id
        assert await job.acancel() is True
        await job.arefresh()
        return job

    job = asyncio.run(scenario())
    assert job.status == "cancelled"
    assert twin.enqueued == [(NAME, {"count": 5, "label": "x"}, signed_in(3), None)]


def test_without_the_app_ready_the_port_says_what_is_missing() -> None:
    previous = enqueueing.install(None)
    try:
        with pytest.raises(RuntimeError, match="INSTALLED_APPS"):
            enqueueing.port()
    finally:
        enqueueing.install(previous)


def test_the_app_plugs_its_calls_in_at_ready() -> None:
    from capabilities.calls.app_calls import AppCalls

    assert isinstance(enqueueing.port(), AppCalls)


def test_authorize_must_be_a_function() -> None:
    with pytest.raises(TypeError, match="authorize= takes a function"):
        capability(NAME, description="x", authorize="notes.owns")  # type: ignore[arg-type]
    assert registry.get(NAME) is None
