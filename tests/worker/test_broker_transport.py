"""The broker transport (capabilities/broker_transport.py) against the test Redis.

The state is the one the tracebacks of the soak's dead heavy workers show: a channel
with a message received and not acknowledged, not closed (its closes failed on the
dead socket), whose connection has dropped its transport; Celery then closes the
connection again before it reconnects (`collect`, then `close`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from kombu import Connection, Consumer, Exchange, Message, Queue
from kombu.transport import redis as kombu_redis

from capabilities import broker_transport
from tests.support.stack import Stack


@pytest.fixture
def queue(stack: Stack) -> Iterator[Queue]:
    name = f"test-broker-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), name)
    yield queue
    with Connection(settings.CELERY_BROKER_URL) as conn:
        queue(conn.default_channel).delete()


def half_closed(
    transport: type[kombu_redis.Transport], queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> Connection:
    """A connection whose channel holds an unacked message, after Celery's `collect`."""
    conn = Connection(settings.CELERY_BROKER_URL, transport=transport)
    with conn.Producer() as producer:
        producer.publish(
            {"n": 1}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue]
        )
    received: list[Message] = []
    Consumer(conn, [queue], callbacks=[lambda _body, message: received.append(message)]).consume()
    conn.drain_events(timeout=5)
    assert len(received) == 1
    channel: Any = conn.default_channel  # a Redis channel; the stubs know only its base
    channel._brpop_start()  # a worker always has a BRPOP in flight
    away = True

    def dead_socket() -> None:
        if away:
            raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(channel, "_brpop_read", dead_socket)
    conn.collect(socket_timeout=1)  # each close of the channel fails on its dead socket
    assert not channel.closed
    assert channel.connection.client is None  # the transport is dropped all the same
    away = False
    return conn


def test_kombus_own_transport_crashes_closing_it_again(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What killed the workers; if kombu fixes it, this fails and the module can go.
    conn = half_closed(kombu_redis.Transport, queue, monkeypatch)
    with pytest.raises(AttributeError, match="hostname"):
        conn.close()


def test_closing_it_again_is_a_connection_error_celery_ignores(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = half_closed(broker_transport.Transport, queue, monkeypatch)
    conn.close()  # kombu ignores the connection error, as Celery does around it
    assert conn.default_channel is not None
