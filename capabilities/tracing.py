"""OpenTelemetry traces of calls: off, and free, unless an OTLP endpoint is configured.

One trace per call, across Daphne and the worker (docs/operating.md#traces):
`abp.call` (the call received: checks, its row, its hand-over), `abp.dispatch` (the
task sent to Celery), `run/abp.run_job` and `abp.run` (the worker, progress as
events), `abp.settle`, `abp.deliver` (the result claimed for its agent) and
`abp.cancel`. The call's span is kept on its job row (`Job.trace_parent`, a W3C
traceparent) because the rest may happen much later and in another process: a
dispatch waits for a fair-share slot, a resume delivers through another Daphne.

The switch is the standard OTEL_* variables, which the SDK reads itself; they are read
here too, once at start, so that with no endpoint nothing of the SDK is imported and
the hot path pays one boolean (`enabled()`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger(__name__)

WEB_SERVICE = "abp-jobs-web"
WORKER_SERVICE = "abp-jobs-worker"

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces: an OTLP endpoint, not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporters in ("", "none"):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def enabled() -> bool:
    """Whether this process records spans (the one check on the hot path)."""
    return _tracer is not None


def setup(default_service: str, *, instrument_celery: bool = False) -> bool:
    """Start exporting spans if the environment asks for it; True if on.

    Called at process start: Daphne (`asgi.with_abp`) and each worker child.
    `instrument_celery`: the worker's task runs get spans from the context in their
    headers (opentelemetry-instrumentation-celery).
    """
    if _tracer is not None or not wanted(os.environ):
        return enabled()
    try:
        provider = _provider_for(default_service, instrument_celery=instrument_celery)
    except ImportError as missing:
        # A process that cannot trace still serves: the operator reads why here.
        logger.error("Traces are off: %s (pip install 'abp-jobs[tracing]')", missing)
        return False
    install(provider)
    return True


def _provider_for(default_service: str, *, instrument_celery: bool) -> TracerProvider:
    """The process's tracer provider, exporting over OTLP/HTTP in batches."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Attributes given here win over OTEL_SERVICE_NAME, so it is read first.
    name = os.environ.get("OTEL_SERVICE_NAME") or default_service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    if instrument_celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    return provider


def install(provider: TracerProvider | None) -> None:
    """Record spans with `provider` (None: stop). Tests give one with an in-memory exporter."""
    global _tracer, _provider  # noqa: PLW0603 - the process's one switch
    _provider = provider
    _tracer = provider.get_tracer("abp-jobs") if provider is not None else None


def shutdown() -> None:
    """Flush the spans still batched and stop (a worker child about to exit)."""
    if _provider is not None:
        _provider.shutdown()


def traceparent(span: Span) -> str:
    """The W3C traceparent of a span, as kept on its job row."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def call_context(trace_parent: str) -> Context | None:
    """The context of a call's span from its traceparent; None if it has none."""
    if not trace_parent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": trace_parent})


def _parent(trace_parent: str) -> Context | None:
    """The current span if it is in the call's trace, else the call's own span.

    A database hop runs in the context of whichever call scheduled it, which may be
    another call's (calls/job_writes.py batches them).
    """
    from opentelemetry import trace

    call = call_context(trace_parent)
    if call is None:
        return None
    current = trace.get_current_span().get_span_context()
    wanted_trace = trace.get_current_span(call).get_span_context().trace_id
    return None if current.is_valid and current.trace_id == wanted_trace else call


@contextmanager
def call_span(**attributes: Any) -> Iterator[str]:
    """`abp.call`, the root of a call's trace, current within; yields its traceparent."""
    from opentelemetry.trace import SpanKind

    assert _tracer is not None
    with _tracer.start_as_current_span(
        "abp.call", kind=SpanKind.SERVER, attributes=_attributes(attributes)
    ) as span:
        yield traceparent(span)


@contextmanager
def span(name: str, trace_parent: str, *, link: bool = False, **attributes: Any) -> Iterator[Span]:
    """A span of the call's trace, current within. `link`: also linked to the call's span."""
    from opentelemetry import trace

    assert _tracer is not None
    parent = _parent(trace_parent)
    links = None
    if link and trace_parent:
        call = trace.get_current_span(call_context(trace_parent)).get_span_context()
        links = [trace.Link(call)]
    with _tracer.start_as_current_span(
        name, context=parent, links=links, attributes=_attributes(attributes)
    ) as current:
        yield current


def started() -> int:
    """Now, for a span recorded once it is over (`record`)."""
    return time.time_ns()


def record(name: str, trace_parent: str, start_ns: int, **attributes: Any) -> None:
    """A span from `start_ns` to now, in the call's trace (known only once it was over)."""
    if not trace_parent or _tracer is None:
        return
    _tracer.start_span(
        name,
        context=_parent(trace_parent),
        start_time=start_ns,
        attributes=_attributes(attributes),
    ).end()


def headers(trace_parent: str) -> dict[str, str]:
    """Task headers carrying the current span (within `abp.dispatch`) to the worker."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or {"traceparent": trace_parent}


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes under `abp.`, without the empty ones."""
    return {f"abp.{key}": str(value) for key, value in attributes.items() if value is not None}
