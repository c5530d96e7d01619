"""The worker's side of a small call, trimmed: what it still guarantees.

The start reads the job in the same statement as its conditional update; a cancelled
job is refused by that update, without a look at the abort flag; progress reaches the
DB at most every interval, counted from the start, and the heartbeat writes what the
interval held back; the delivery claim is one prebuilt statement; Markdown reuses one
converter per thread without carrying anything from one document to the next.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime
from typing import Any

import markdown
import pytest
from django.test import override_settings

from capabilities.endings import cancellation
from capabilities.jobs import abort_flags, dispatch, lifecycle, notes, queue
from capabilities.models import AgentSession, CancelSource, Job, JobStatus
from capabilities.work.context import JobAborted
from capabilities.work.markdown import runner as markdown_html
from capabilities.worker import executor
from capabilities.worker.interrupter import Interrupter

pytestmark = pytest.mark.usefixtures("database")

# Python-Markdown recurses once per level of Markdown inside HTML on every Python; a
# nested list recurses only on 3.11 (3.12 and 3.13 convert it at any depth).
NESTED_TOO_DEEPLY = '<div markdown="1">\n' * 1500 + "x\n" + "</div>\n" * 1500


def new_job(**fields: Any) -> Job:
    session = AgentSession.objects.create(agent_name="small call")
    values: dict[str, Any] = {
        "session": session,
        "call_id": str(uuid.uuid4()),
        "capability": "test.sleep",
        "params": {"steps": 0, "echo": ["é", 1, None]},
        **fields,
    }
    return Job.objects.create(**values)


@pytest.fixture
def no_redis(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Notes recorded, the pump skipped; reading an abort flag fails the test."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def notify(session_id: str, note: dict[str, Any]) -> bool:
        sent.append((session_id, note))
        return True

    def is_raised(job_id: str) -> bool:
        raise AssertionError("the worker read the abort flag")

    monkeypatch.setattr(notes, "notify", notify)
    monkeypatch.setattr(abort_flags, "is_raised", is_raised)
    monkeypatch.setattr(dispatch, "pump_safely", lambda queues=None: None)
    monkeypatch.setattr(executor, "INTERRUPTER", Interrupter())
    return sent


# --- The start ---------------------------------------------------------------------------


@pytest.mark.parametrize("events_on", [False, True])
def test_the_start_returns_the_job_as_the_orm_reads_it(events_on: bool) -> None:
    job = new_job(progress_token="tok-1", notify_started=True)
    level = logging.INFO if events_on else logging.WARNING
    logger = logging.getLogger("abp.jobs")
    old_level = logger.level
    logger.setLevel(level)
    try:
        started = lifecycle.start(str(job.id), "w1", executor.WORKER_FIELDS)
    finally:
        logger.setLevel(old_level)
    assert started is not None
    expected = Job.objects.get(pk=job.id)
    assert expected.status == JobStatus.RUNNING
    assert expected.worker == "w1"
    for name in executor.WORKER_FIELDS:
        assert getattr(started, name) == getattr(expected, name), name
    assert started.id == job.id
    assert isinstance(started.session_id, uuid.UUID)
    assert isinstance(started.created_at, datetime)
    assert started.created_at.tzinfo is not None
    assert started.params == {"steps": 0, "echo": ["é", 1, None]}
    assert started.notify_started is True


def test_a_job_starts_once() -> None:
    job = new_job()
    assert lifecycle.start(str(job.id), "w1", executor.WORKER_FIELDS) is not None
    assert lifecycle.start(str(job.id), "w2", executor.WORKER_FIELDS) is None
    assert Job.objects.get(pk=job.id).worker == "w1"


def test_a_cancelled_job_never_starts_without_reading_its_flag(
    no_redis: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel settles before it raises the flag: the conditional start refuses the job."""
    monkeypatch.setattr(abort_flags, "raise_flag", lambda job_id: None)
    monkeypatch.setattr(queue, "revoke", lambda job_id, kill=False: None)
    job = new_job()
    assert cancellation.cancel(job.id, source=CancelSource.AGENT)
    ran: list[str] = []
    monkeypatch.setattr(executor, "_run", lambda *args: ran.append("ran"))
    executor.execute(str(job.id), worker_name="w1")
    assert ran == []
    row = Job.objects.get(pk=job.id)
    assert row.status == JobStatus.CANCELLED
    assert row.started_at is None
    assert row.worker == ""


def test_a_small_call_runs_settles_and_answers_once(
    no_redis: list[tuple[str, dict[str, Any]]],
) -> None:
    job = new_job(notify_started=True)
    executor.execute(str(job.id), worker_name="w1")
    row = Job.objects.get(pk=job.id)
    assert row.status == JobStatus.SUCCEEDED
    assert row.result == {"echo": ["é", 1, None], "steps": 0}
    assert row.stopped_at == row.settled_at
    types = [note["type"] for _, note in no_redis]
    assert types == ["job.started", "job.settled"]
    settled = no_redis[-1][1]
    assert settled["response"]["data"] == {"echo": ["é", 1, None], "steps": 0}
    assert {session for session, _ in no_redis} == {str(job.session_id)}
    # A second delivery of the same task does nothing.
    executor.execute(str(job.id), worker_name="w2")
    assert len(no_redis) == 2


# --- Progress ------------------------------------------------------------------------------


def test_progress_within_the_first_interval_stays_out_of_the_db_until_the_heartbeat(
    no_redis: list[tuple[str, dict[str, Any]]],
) -> None:
    job = new_job(progress_token="tok")
    started = lifecycle.start(str(job.id), "w1", executor.WORKER_FIELDS)
    assert started is not None
    context = executor.WorkerContext(started, Interrupter())
    with override_settings(ABP={**_abp(), "PROGRESS_DB_INTERVAL_SECONDS": 60}):
        context.report(progress=1, total=4, stage="first")
        context.report(progress=2, total=4, stage="second")
    # The agent heard both at once; the DB has neither yet.
    assert [note["stage"] for _, note in no_redis] == ["first", "second"]
    assert Job.objects.get(pk=job.id).progress is None
    # The heartbeat writes the last one held back, once.
    executor._running = context
    try:
        heartbeat_once(str(job.id))
        row = Job.objects.get(pk=job.id)
        assert (row.progress, row.progress_total, row.stage) == (2, 4, "second")
        assert executor.take_unsaved_progress(str(job.id)) is None
    finally:
        executor._running = None


def test_progress_after_the_interval_is_written_at_once(
    no_redis: list[tuple[str, dict[str, Any]]],
) -> None:
    job = new_job()
    started = lifecycle.start(str(job.id), "w1", executor.WORKER_FIELDS)
    assert started is not None
    context = executor.WorkerContext(started, Interrupter())
    with override_settings(ABP={**_abp(), "PROGRESS_DB_INTERVAL_SECONDS": 0}):
        context.report(progress=3, total=None, stage="s" * 150)
    row = Job.objects.get(pk=job.id)
    assert (row.progress, row.progress_total, row.stage) == (3, None, "s" * 100)
    assert context.take_unsaved_progress() is None
    assert no_redis == []  # no progress token: nothing for the agent


def heartbeat_once(job_id: str) -> None:
    """What one beat of the heartbeat thread writes."""
    lifecycle.heartbeat(job_id, executor.take_unsaved_progress(job_id))


def _abp() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.ABP)


# --- Delivery ------------------------------------------------------------------------------


def test_a_settled_result_is_claimed_once_and_an_active_one_never() -> None:
    job = new_job()
    assert not lifecycle.claim_delivery(job.id)
    assert lifecycle.settle(job.id, lifecycle.Outcome.succeeded({}))
    assert lifecycle.claim_delivery(str(job.id))
    assert not lifecycle.claim_delivery(job.id)
    assert Job.objects.get(pk=job.id).delivered_at is not None
    # Given back, it can be claimed again (by whoever holds the session now).
    Job.objects.filter(pk=job.id).update(delivered_at=None)
    assert lifecycle.claim_delivery(job.id)


# --- Markdown ------------------------------------------------------------------------------

DOCUMENTS = (
    "# T\n\nText[^1] and *HTML*.\n\n[^1]: A note.\n\n*[HTML]: Hyper Text",
    "| a | b |\n|:-|-:|\n| 1 | 2 |",
    "```python\nprint(1)\n```\n\nTerm\n: Definition",
    '<div markdown="1">\n*inside*\n</div>\n\n<p>raw</p>',
    "1. a\n2. b\n\n[ref]: https://example.com\n\n[link][ref]",
    "abbr HTML here, [link][ref] and a note[^1] without definitions",
)


def fresh(text: str) -> str:
    html: str = markdown.markdown(
        text, extensions=list(markdown_html.EXTENSIONS), output_format="html"
    )
    return html


def test_the_reused_converter_converts_as_a_fresh_one() -> None:
    for first in DOCUMENTS:
        for second in DOCUMENTS:
            markdown_html.to_html(first, sanitize=False)
            assert markdown_html.to_html(second, sanitize=False) == fresh(second)


def test_a_conversion_ended_halfway_leaves_nothing_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = markdown.Markdown.convert

    def halfway(self: markdown.Markdown, source: str) -> str:
        self.htmlStash.store("<b>stale</b>")
        self.references["ref"] = ("https://stale.example", None)
        raise RecursionError

    monkeypatch.setattr(markdown.Markdown, "convert", halfway)
    with pytest.raises(Exception, match="nested too deeply"):
        markdown_html.to_html("[^1]\n\n[^1]: half")
    monkeypatch.setattr(markdown.Markdown, "convert", original)
    text = DOCUMENTS[-1]
    assert markdown_html.to_html(text, sanitize=False) == fresh(text)


def test_a_document_nested_too_deeply_leaves_the_next_converted_as_fresh() -> None:
    # Python-Markdown's own state after a real RecursionError: reset() does not undo it
    # (raw HTML came out escaped for every later document).
    with pytest.raises(Exception, match="nested too deeply"):
        markdown_html.to_html(NESTED_TOO_DEEPLY)
    text = '<img src="x.png" alt="X">\n\n*after*'
    assert markdown_html.to_html(text, sanitize=False) == fresh(text)


def test_a_cancel_raised_into_a_conversion_drops_the_converter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = markdown_html._converter()

    def aborted(self: markdown.Markdown, source: str) -> str:
        raise JobAborted

    monkeypatch.setattr(markdown.Markdown, "convert", aborted)
    with pytest.raises(JobAborted):
        markdown_html.to_html("# x")
    monkeypatch.undo()
    assert markdown_html._converter() is not before


def test_each_thread_has_its_own_converter() -> None:
    seen: list[markdown.Markdown] = []

    def convert() -> None:
        markdown_html.to_html("# x")
        seen.append(markdown_html._converter())

    threads = [threading.Thread(target=convert) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    mine = markdown_html._converter()
    assert len({id(converter) for converter in (*seen, mine)}) == 3
