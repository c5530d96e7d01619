"""Traces on the real stack: a call, and a cancelled call, each one connected trace.

A Daphne and a worker of their own export to a local OTLP/HTTP receiver; the
capability goes to a queue only that worker consumes, so the stack's untraced
worker never takes it.
"""

from __future__ import annotations

import gzip
import http.server
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from capabilities.models import Job
from tests.support.agent import Agent
from tests.support.jobs import wait_running
from tests.support.stack import ManagedProcess, Stack, free_port, port_open, python_tool
from tests.support.waiting import eventually

QUEUE = "abp.traced"


@dataclass(frozen=True, kw_only=True)
class Received:
    """One span as the receiver decoded it."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    events: tuple[str, ...]


class Receiver(http.server.BaseHTTPRequestHandler):
    """POST /v1/traces: OTLP/HTTP protobuf, every span kept."""

    spans: list[Received]
    lock: threading.Lock

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope in resource.scope_spans:
                    self.spans.extend(
                        Received(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            service=service,
                            events=tuple(event.name for event in span.events),
                        )
                        for span in scope.spans
                    )
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def received() -> Iterator[tuple[int, list[Received]]]:
    """A local OTLP/HTTP receiver: its port, and the spans it got so far."""
    spans: list[Received] = []
    handler = type("Handler", (Receiver,), {"spans": spans, "lock": threading.Lock()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], spans
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def traced(stack: Stack, received: tuple[int, list[Received]]) -> Iterator[str]:
    """A traced Daphne and worker of their own: the Daphne's WebSocket URL."""
    port, _ = received
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "ABP_CAPABILITY_QUEUES": f"test.sleep={QUEUE}",
    }
    worker = ManagedProcess(
        "worker-traced",
        python_tool(
            "celery", "-A", "abpsite", "worker", "-Q", QUEUE, "-P", "prefork",
            "-c", "1", "-l", "info", "-n", f"traced-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle",
        ),
        stack.run_dir,
        env,
    )  # fmt: skip
    web_port = free_port()
    web = stack.new_web(web_port, name="daphne-traced", env=env)
    try:
        worker.start(lambda: " ready." in worker.log_text())
        web.start(lambda: port_open(web_port))
        yield f"ws://127.0.0.1:{web_port}/abp/ws"
    finally:
        web.stop()
        worker.stop()


def trace_of(spans: list[Received], job: Job) -> list[Received]:
    """The spans of the job's call's trace."""
    trace_id = job.trace_parent.split("-")[1]
    return [span for span in list(spans) if span.trace_id == trace_id]


BOTH = {"abp-jobs-web", "abp-jobs-worker"}


def complete(
    spans: list[Received], job: Job, names: set[str], services: set[str] = BOTH
) -> list[Received] | None:
    """The trace, once it has every span named, from each of `services`."""
    found = trace_of(spans, job)
    if names <= {span.name for span in found} and services == {s.service for s in found}:
        return found
    return None


def assert_connected(trace: list[Received]) -> None:
    """One root (the call's span), and every other span's parent in the trace."""
    ids = {span.span_id for span in trace}
    roots = [span for span in trace if not span.parent_id]
    assert [root.name for root in roots] == ["abp.call"], trace
    orphans = [span for span in trace if span.parent_id and span.parent_id not in ids]
    assert orphans == [], trace


def test_a_call_and_a_cancelled_call_each_form_one_trace_across_daphne_and_the_worker(
    traced: str, received: tuple[int, list[Received]]
) -> None:
    _, spans = received
    agent = Agent(traced)
    agent.initialize()
    answered = agent.result_of(
        agent.call("test.sleep", {"steps": 3, "stepMs": 20}, call_id="traced-done"), timeout=30
    )
    assert answered["payload"]["success"] is True, answered
    cancelled = agent.call("test.sleep", {"steps": 500, "stepMs": 20}, call_id="traced-cancel")
    wait_running(agent, "traced-cancel", timeout=20)
    agent.cancel("traced-cancel")
    outcome = agent.result_of(cancelled, timeout=30)
    assert outcome["payload"]["success"] is False, outcome
    agent.close()

    done = Job.objects.get(session_id=agent.session_id, call_id="traced-done")
    stopped = Job.objects.get(session_id=agent.session_id, call_id="traced-cancel")
    assert done.trace_parent
    assert stopped.trace_parent
    assert done.trace_parent.split("-")[1] != stopped.trace_parent.split("-")[1]

    every_step = {"abp.call", "abp.dispatch", "run/abp.run_job", "abp.run", "abp.settle"}
    first = eventually(lambda: complete(spans, done, every_step | {"abp.deliver"}), 20)
    assert_connected(first)
    run = next(span for span in first if span.name == "abp.run")
    assert run.events == ("progress",) * 3
    second = eventually(lambda: complete(spans, stopped, every_step | {"abp.cancel"}), 20)
    assert_connected(second)
    # The cancel settled in Daphne, under its own span; the worker's settle lost.
    cancel = next(span for span in second if span.name == "abp.cancel")
    settles = [span for span in second if span.name == "abp.settle"]
    assert [(s.parent_id, s.service) for s in settles] == [(cancel.span_id, "abp-jobs-web")]


def test_a_call_run_beside_daphne_is_one_trace_of_the_web_process(
    traced: str, received: tuple[int, list[Received]]
) -> None:
    _, spans = received
    agent = Agent(traced)
    agent.initialize()
    answered = agent.result_of(
        agent.call("convert.markdownToHtml", {"markdown": "# traced"}, call_id="local")
    )
    assert answered["payload"]["success"] is True, answered
    agent.close()
    job = Job.objects.get(session_id=agent.session_id, call_id="local")
    assert job.queue == "local"
    names = {"abp.call", "abp.run", "abp.settle", "abp.deliver"}
    assert_connected(eventually(lambda: complete(spans, job, names, {"abp-jobs-web"}), 20))
