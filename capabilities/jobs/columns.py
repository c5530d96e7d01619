"""Column names for the hand-written SQL of the hot paths, quoted for the connection."""

from __future__ import annotations

from django.db import connection
from django.db.models import Model


def quoted_column(model: type[Model], name: str) -> str:
    """The column of field `name` (a concrete field, or "pk") of `model`, quoted."""
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    column = getattr(field, "column", None)
    if not isinstance(column, str):
        raise LookupError(f"{model.__name__}.{name} has no column.")
    return connection.ops.quote_name(column)
