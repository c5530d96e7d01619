"""A new job's INSERT, as one SQL statement built once from the model.

`Model.save(force_insert=True)` spends most of a job's insert in Python: it walks
the fields, builds the compiler and its SQL, and sends signals nobody listens to
(docs/benchmarks.md, "Where a call's CPU goes"). In Daphne that Python holds the
GIL the event loop needs. The statement text is built once; each value goes
through its field's own `pre_save` and `get_db_prep_save`, so the row is stored
exactly as the ORM stores it, on SQLite and PostgreSQL alike. Errors are the
ORM's too: the cursor wraps them (a duplicate callId raises IntegrityError).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connection
from django.db.models import Field

from capabilities.jobs.columns import quoted_column
from capabilities.models import Job


@functools.cache
def _fields() -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in Job._meta.concrete_fields)


@functools.cache
def _statement(vendor: str) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quoted_column(Job, field.name) for field in _fields())
    placeholders = ", ".join(["%s"] * len(_fields()))
    return f"INSERT INTO {quote(Job._meta.db_table)} ({columns}) VALUES ({placeholders})"


def insert(job: Job) -> None:
    """Store a new job (one autocommitted INSERT); the instance is then saved, as after save()."""
    params = [field.get_db_prep_save(field.pre_save(job, True), connection) for field in _fields()]
    with connection.cursor() as cursor:
        cursor.execute(_statement(connection.vendor), params)
    job._state.adding = False
    job._state.db = connection.alias
