"""PEQ's ``queue_configuration`` table: optional, per queue, read at start.

PEQ keeps a queue's settings in a table of its schema, one row per setting,
with its columns (``setting_name, value, unit, casted_as, note,
modified_on``). sqla-queue reads the same table, named
``queue_configuration`` in the queue table's schema, or the name the model
gives as ``__queue_configuration__`` (when several queues share a schema).
A row's ``unit`` converts its value (``2`` ``hours`` for a setting in
seconds is 7200); ``casted_as`` and ``note`` are for people. The settings it
may hold, and their precedence, are in ``catalog.py``.

The table is created like the queue's: ``configuration_table(metadata)``
then ``metadata.create_all()`` (or a migration).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, MetaData, String, Table, Text, inspect, select

from .catalog import TableRow
from .identifiers import split_table_name
from .types import UtcDateTime, utc_now

__all__ = ["CONFIGURATION_TABLE", "configuration_table", "configuration_table_of", "read_rows"]

CONFIGURATION_TABLE = "queue_configuration"


def configuration_table(
    metadata: MetaData, name: str = CONFIGURATION_TABLE, *, schema: str | None = None
) -> Table:
    """The ``queue_configuration`` table in ``metadata`` (made once)."""
    key = f"{schema}.{name}" if schema else name
    if key in metadata.tables:
        return metadata.tables[key]
    return Table(
        name,
        metadata,
        Column("setting_name", String(100), primary_key=True),
        Column("value", String(500)),
        Column("unit", String(20)),
        Column("casted_as", String(20), server_default="INTEGER"),
        Column("note", Text),
        Column("modified_on", UtcDateTime, server_default=utc_now()),
        schema=schema,
    )


def configuration_table_of(model: Any) -> Table:
    """The configuration table a queue model names (validated), in a
    MetaData of its own: reading it never touches the application's."""
    table: Table = model.__table__
    named = getattr(model, "__queue_configuration__", None)
    if named is None:
        schema, name = table.schema, CONFIGURATION_TABLE
    else:
        schema, name = split_table_name(named)
        schema = schema or table.schema
    return configuration_table(MetaData(), name, schema=schema)


def read_rows(conn: Connection, table: Table) -> dict[str, TableRow] | None:
    """The table's rows by setting name; None when the table does not exist."""
    if not inspect(conn).has_table(table.name, schema=table.schema):
        return None
    c = table.c
    rows = conn.execute(select(c.setting_name, c.value, c.unit, c.casted_as, c.note))
    return {
        str(name): TableRow(str(name), value, unit, casted_as, note)
        for name, value, unit, casted_as, note in rows
    }
