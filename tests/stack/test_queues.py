"""Queues by cost: a small call runs on its own worker, never behind busy heavy ones."""

from __future__ import annotations

from django.test import override_settings

from capabilities.jobs import queue
from capabilities.models import Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.stack import Stack

LONG = {"mode": "checkpoint", "steps": 3000, "stepMs": 20}
QUEUES = {"small": "abp.small", "heavy": "abp.heavy"}


def test_each_capability_goes_to_its_cost_class_queue() -> None:
    assert queue.queue_for("convert.markdownToHtml") == "abp.small"
    assert queue.queue_for("export.pdf") == "abp.heavy"
    assert queue.queue_for("process.image") == "abp.heavy"
    assert queue.queue_for("test.sleep") == "abp.heavy"


def test_a_setting_moves_a_capability_to_another_queue() -> None:
    abp = {"QUEUES": QUEUES, "CAPABILITY_QUEUES": {"export.pdf": "abp.pdf"}}
    with override_settings(ABP=abp):
        assert queue.queue_for("export.pdf") == "abp.pdf"
        assert queue.queue_for("process.image") == "abp.heavy"


def test_the_queues_of_the_cost_classes_are_settings() -> None:
    abp = {"QUEUES": {"small": "fast", "heavy": "slow"}, "CAPABILITY_QUEUES": {}}
    with override_settings(ABP=abp):
        assert queue.queue_for("convert.markdownToHtml") == "fast"
        assert queue.queue_for("export.pdf") == "slow"


def test_a_small_call_is_answered_while_every_heavy_worker_is_busy(
    agent: Agent, stack: Stack
) -> None:
    # Both processes of the heavy worker run a minute of work.
    heavy = [agent.call("test.sleep", LONG, call_id=f"heavy-{n}") for n in range(2)]
    for n in range(2):
        wait_running(agent, f"heavy-{n}")

    # Larger than the local lane takes: the small queue's worker runs it.
    document = {"markdown": "# Hi\n\n" + "word " * 20_000}
    small = agent.call("convert.markdownToHtml", document, call_id="small")
    result = agent.result_of(small)

    assert result["payload"]["success"] is True
    assert "<h1" in result["payload"]["data"]["html"]
    # Answered while the heavy work still ran: it did not wait behind it.
    heavy_jobs = Job.objects.filter(session_id=agent.session_id, call_id__startswith="heavy-")
    assert {job.status for job in heavy_jobs} == {JobStatus.RUNNING}
    small_job = Job.objects.get(session_id=agent.session_id, call_id="small")
    assert small_job.worker.startswith("worker-abp.small-")
    for n, call in enumerate(heavy):
        agent.cancel(f"heavy-{n}")
        assert agent.result_of(call)["payload"]["cancelled"] is True
