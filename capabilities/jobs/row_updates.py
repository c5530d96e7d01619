"""Conditional single-row UPDATEs of jobs, as one SQL statement built from the model.

The settle and the start of every job run here. `QuerySet.update()` spends about
0.25 ms of Python building the same statement each time (measured with
bench-free micro timing: 0.27 ms against 0.03 ms for the statement itself), and in
Daphne that Python competes with the event loop for the GIL, which tripled it.
The statement text is built once per shape from the model's metadata; values go
through each field's own `get_db_prep_save`, so JSON, UUIDs and datetimes are
stored exactly as the ORM stores them, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any, cast

from django.db import connection
from django.db.models import Field

from capabilities.models import Job


def _field(name: str) -> Field[Any, Any]:
    return cast("Field[Any, Any]", Job._meta.get_field(name))


@functools.cache
def _statement(
    vendor: str, columns: tuple[str, ...], statuses: int, stop_if: bool, where_null: str | None
) -> str:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    status = quote(_field("status").column)
    assignments = [f"{quote(_field(name).column)} = %s" for name in columns]
    if stop_if:
        stopped = quote(_field("stopped_at").column)
        assignments.append(f"{stopped} = CASE WHEN {status} = %s THEN %s ELSE {stopped} END")
    placeholders = ", ".join(["%s"] * statuses)
    also = f" AND {quote(_field(where_null).column)} IS NULL" if where_null else ""
    return (
        f"UPDATE {table} SET {', '.join(assignments)} "
        f"WHERE {quote(Job._meta.pk.column)} = %s AND {status} IN ({placeholders}){also}"
    )


def update_if(
    job_id: uuid.UUID | str,
    statuses: tuple[str, ...],
    values: dict[str, Any],
    *,
    stop_if: tuple[str, datetime] | None = None,
    where_null: str | None = None,
) -> bool:
    """Write `values` if the job's status is one of `statuses`; True if a row changed.

    `stop_if=(status, when)` also sets stopped_at to `when` if the row was in `status`;
    `where_null` names a field that must also still be null.
    """
    columns = tuple(values)
    params = [_field(name).get_db_prep_save(value, connection) for name, value in values.items()]
    if stop_if is not None:
        params += [stop_if[0], _field("stopped_at").get_db_prep_save(stop_if[1], connection)]
    params.append(Job._meta.pk.get_db_prep_save(uuid.UUID(str(job_id)), connection))
    params += list(statuses)
    sql = _statement(connection.vendor, columns, len(statuses), stop_if is not None, where_null)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.rowcount == 1)
