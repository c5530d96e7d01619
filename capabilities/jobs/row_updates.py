"""Conditional single-row UPDATEs of jobs, as one SQL statement built from the model.

The settle, the start and the delivery claim of every job run here; the start also
returns what the worker reads of its job, in the same statement (RETURNING), instead
of a second query. `QuerySet.update()` builds the same statement in Python each
time, at several times the cost of the statement itself, and in Daphne that Python
competes with the event loop for the GIL (docs/benchmarks.md, "Other measurements").
The statement text is built once per shape from the model's metadata; values go
through each field's own `get_db_prep_save`, so JSON, UUIDs and datetimes are
stored exactly as the ORM stores them, on SQLite and PostgreSQL alike.

The hand-over to Celery, the start, the settle and the end of the work are all
updates here, so this is where their job events are logged (`events`): while they
are on, the same statement returns the job's fields (RETURNING), so logging them
costs no query. So are the settle's and the delivery claim's spans while traces are
on (capabilities/tracing.py): the statement returns the call's traceparent too.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any, cast

from django.db import connection
from django.db.models import Field

from capabilities import tracing
from capabilities.jobs import events
from capabilities.jobs.columns import quoted_column
from capabilities.models import AgentSession, Job, JobStatus


def _field(name: str) -> Field[Any, Any]:
    return cast("Field[Any, Any]", Job._meta.get_field(name))


@functools.cache
def _statement(
    vendor: str,
    columns: tuple[str, ...],
    statuses: int,
    stop_if: bool,
    where_null: str | None,
    *,
    fields: tuple[str, ...] = (),
    returning: bool = False,
    traced: bool = False,
) -> str:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    status = quoted_column(Job, "status")
    assignments = [f"{quoted_column(Job, name)} = %s" for name in columns]
    if stop_if:
        stopped = quoted_column(Job, "stopped_at")
        assignments.append(f"{stopped} = CASE WHEN {status} = %s THEN %s ELSE {stopped} END")
    placeholders = ", ".join(["%s"] * statuses)
    only = f" AND {status} IN ({placeholders})" if statuses else ""
    also = f" AND {quoted_column(Job, where_null)} IS NULL" if where_null else ""
    returned = [f"{table}.{quoted_column(Job, name)}" for name in fields]
    if returning:
        returned.append(_event_columns(table))
    if traced:
        returned.append(f"{table}.{quoted_column(Job, 'trace_parent')}")
    return (
        f"UPDATE {table} SET {', '.join(assignments)} "
        f"WHERE {quoted_column(Job, 'pk')} = %s{only}{also}"
        + (f" RETURNING {', '.join(returned)}" if returned else "")
    )


def _event_columns(table: str) -> str:
    """The job's event fields (events.CONTEXT_COLUMNS), its session's door, its stopped_at.

    stopped_at as is, tested in Python: SQLite 3.40 answered `stopped_at IS NOT NULL`
    with 1 for a NULL here (in a RETURNING clause, on this table).
    """
    quote = connection.ops.quote_name
    sessions = quote(AgentSession._meta.db_table)
    door = quoted_column(AgentSession, "door")
    session_pk = quoted_column(AgentSession, "pk")
    session_id = quoted_column(Job, "session")
    stopped = quoted_column(Job, "stopped_at")
    columns = ", ".join(f"{table}.{quoted_column(Job, name)}" for name in events.CONTEXT_COLUMNS)
    return (
        f"{columns}, (SELECT {sessions}.{door} FROM {sessions}"
        f" WHERE {sessions}.{session_pk} = {table}.{session_id}), {table}.{stopped}"
    )


def _event_of(values: dict[str, Any], where_null: str | None) -> str | None:
    """Which job event an update is, if any (a heartbeat is none)."""
    if "settled_at" in values:
        return "settled"
    if values.get("status") == JobStatus.RUNNING:
        return "started"
    if where_null == "dispatched_at":
        return "dispatched"
    if "stopped_at" in values:  # not a heartbeat's `where_null`: that writes no stop
        return "stopped"
    return None


def _span_of(values: dict[str, Any]) -> str | None:
    """Which span an update is, if any: a settle (perhaps claiming its delivery too), or a claim."""
    if "settled_at" in values:
        return "abp.settle"
    if "delivered_at" in values and values["delivered_at"] is not None:
        return "abp.deliver"
    return None


def _details(event: str, values: dict[str, Any]) -> dict[str, Any]:
    """What an event says beyond the job's fields, from the values it wrote."""
    if event == "settled":
        details: dict[str, Any] = {"outcome": str(values["status"])}
        if values.get("error_code"):
            details["errorCode"] = values["error_code"]
        if values.get("cancel_source"):
            details["cancelSource"] = str(values["cancel_source"])
        return details
    if event == "started":
        return {"worker": values.get("worker", "")}
    if event == "stopped" and values.get("hard_killed"):
        return {"hardKilled": True}
    return {}


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
    `where_null` names a field that must also still be null. No `statuses`: any status.
    """
    return _update(job_id, statuses, values, stop_if=stop_if, where_null=where_null) is not None


def update_returning(
    job_id: uuid.UUID | str,
    statuses: tuple[str, ...],
    values: dict[str, Any],
    fields: tuple[str, ...],
) -> Job | None:
    """`update_if`, and the job as the same statement left it (only `fields` loaded).

    None if no row changed. One statement instead of an update and a read: the row
    read is the row the update decided on (RETURNING, on SQLite and PostgreSQL).
    """
    row = _update(job_id, statuses, values, fields=fields)
    if row is None:
        return None
    by_attname: dict[str, Any] = {"id": uuid.UUID(str(job_id))}
    for name, value in zip(fields, row, strict=True):
        by_attname[_field(name).attname] = _from_db(name, value)
    # Model.from_db takes a subset of the fields' values in the model's field order.
    names = [f.attname for f in Job._meta.concrete_fields if f.attname in by_attname]
    return Job.from_db(connection.alias, names, [by_attname[name] for name in names])


def _from_db(name: str, value: Any) -> Any:
    """A returned column's value as the ORM reads it (JSON, UUIDs, datetimes, booleans)."""
    field = _field(name)
    column = field.get_col(Job._meta.db_table)
    for convert in (
        *connection.ops.get_db_converters(column),
        # Not in django-stubs' Field, though every field has it.
        *cast(Any, field).get_db_converters(connection),
    ):
        value = convert(value, column, connection)
    return value


def _update(
    job_id: uuid.UUID | str,
    statuses: tuple[str, ...],
    values: dict[str, Any],
    *,
    fields: tuple[str, ...] = (),
    stop_if: tuple[str, datetime] | None = None,
    where_null: str | None = None,
) -> tuple[Any, ...] | None:
    """Run the update; None if no row changed, else the returned `fields`' values."""
    columns = tuple(values)
    params = [_field(name).get_db_prep_save(value, connection) for name, value in values.items()]
    if stop_if is not None:
        params += [stop_if[0], _field("stopped_at").get_db_prep_save(stop_if[1], connection)]
    params.append(Job._meta.pk.get_db_prep_save(uuid.UUID(str(job_id)), connection))
    params += list(statuses)
    event = _event_of(values, where_null) if events.enabled() else None
    span = _span_of(values) if tracing.enabled() else None
    began = tracing.started() if span is not None else 0
    sql = _statement(
        connection.vendor,
        columns,
        len(statuses),
        stop_if is not None,
        where_null,
        fields=fields,
        returning=event is not None,
        traced=span is not None,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if event is None and span is None and not fields:
            return () if cursor.rowcount == 1 else None
        rows = cursor.fetchall()
    if len(rows) != 1:
        return None
    row = tuple(rows[0])
    if span is not None:
        row, trace_parent = row[:-1], row[-1]
        _record(span, job_id, values, trace_parent, began)
    if event is not None:
        *context, stopped = row[len(fields) :]
        details = _details(event, values)
        if event == "settled":
            details["workStopped"] = stopped is not None
        events.emit_row(event, job_id, tuple(context), **details)
    return row[: len(fields)]


def _record(
    span: str, job_id: uuid.UUID | str, values: dict[str, Any], trace_parent: str, began: int
) -> None:
    """The settle's span (and the delivery's, if it claimed it too), in the call's trace."""
    outcome = str(values["status"]) if "status" in values else None
    tracing.record(span, trace_parent, began, job_id=job_id, outcome=outcome)
    if span == "abp.settle" and values.get("delivered_at") is not None:
        tracing.record("abp.deliver", trace_parent, began, job_id=job_id)
