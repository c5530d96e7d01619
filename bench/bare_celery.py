"""A bare Celery app (Redis broker and result backend): the baseline for a small call."""

from __future__ import annotations

import os

from celery import Celery

app = Celery(
    "bare",
    broker=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_default_queue="bare",
)


@app.task(name="bare.echo")
def echo(value: object) -> object:
    """Return the value: the smallest possible task."""
    return value
