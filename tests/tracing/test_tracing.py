"""The switch (the OTEL_* variables) and the call's traceparent, in process."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from capabilities import tracing

ENDPOINT = "http://127.0.0.1:4318"

# Every module `tracing.setup` imports when on: off, none of them may be imported.
SDK_MODULES = (
    "opentelemetry.sdk",
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.resources",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.instrumentation.celery",
)


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "abp"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_traces_are_on_only_with_an_otlp_endpoint_and_not_disabled(
    environ: dict[str, str], on: bool
) -> None:
    assert tracing.wanted(environ) is on


def test_off_imports_nothing_of_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name in SDK_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises
    assert tracing.setup(tracing.WEB_SERVICE) is False
    assert tracing.enabled() is False


def test_on_without_the_sdk_stays_off_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    for name in SDK_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    assert tracing.setup(tracing.WORKER_SERVICE) is False
    assert tracing.enabled() is False
    assert "abp-jobs[tracing]" in caplog.text


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans recorded in memory while the test runs; off again after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def parent_of(span: ReadableSpan) -> int:
    """A span's parent's id (it must have one)."""
    assert span.parent is not None
    return span.parent.span_id


def test_the_calls_traceparent_brings_later_spans_into_its_trace(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.call_span(call_id="c1", capability="test.sleep") as trace_parent:
        pass
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", trace_parent)
    _, trace_id, span_id, _ = trace_parent.split("-")
    # Later, in another process: the run, its settle inside it, the delivery alone.
    with tracing.span("abp.run", trace_parent, job_id="j1"):
        tracing.record("abp.settle", trace_parent, tracing.started(), outcome="succeeded")
    tracing.record("abp.deliver", trace_parent, tracing.started())
    found = {span.name: span for span in spans.get_finished_spans()}
    call, run = found["abp.call"], found["abp.run"]
    assert call.parent is None
    assert call.attributes == {"abp.call_id": "c1", "abp.capability": "test.sleep"}
    for span in found.values():
        assert f"{span.context.trace_id:032x}" == trace_id
    assert f"{parent_of(run):016x}" == span_id
    assert parent_of(found["abp.settle"]) == run.context.span_id
    assert f"{parent_of(found['abp.deliver']):016x}" == span_id


def test_a_span_under_another_calls_span_still_joins_its_own_call(
    spans: InMemorySpanExporter,
) -> None:
    # A batched database hop runs in whichever call's context scheduled it.
    with tracing.call_span(call_id="first") as first:
        pass
    with tracing.call_span(call_id="second"):
        with tracing.span("abp.dispatch", first):
            pass
        tracing.record("abp.settle", first, tracing.started())
    first_span = first.split("-")[2]
    for name in ("abp.dispatch", "abp.settle"):
        span = next(s for s in spans.get_finished_spans() if s.name == name)
        assert f"{parent_of(span):016x}" == first_span


def test_a_cancel_is_a_child_of_the_call_and_linked_to_it(spans: InMemorySpanExporter) -> None:
    with tracing.call_span(call_id="c1") as trace_parent:
        pass
    with tracing.span("abp.cancel", trace_parent, link=True, source="agent"):
        pass
    cancel = next(s for s in spans.get_finished_spans() if s.name == "abp.cancel")
    call_span_id = int(trace_parent.split("-")[2], 16)
    assert parent_of(cancel) == call_span_id
    assert [link.context.span_id for link in cancel.links] == [call_span_id]
    assert cancel.attributes == {"abp.source": "agent"}


def test_a_job_without_a_traceparent_records_nothing(spans: InMemorySpanExporter) -> None:
    tracing.record("abp.settle", "", tracing.started())
    assert spans.get_finished_spans() == ()
