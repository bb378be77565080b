"""The statements on a configuration table (``queue_configuration``:
``configuration_table.py``): the rows that apply to a queue, and the rows
sqla-queue itself keeps there (the paused processes: ``pause.py``; the
periodic tasks' last runs: ``maintenance/periodic.py``).

``queue`` names a row's queue (its ``queue_name``); None where the table in
the database has no such column (PEQ's own, or one made before it), whose
rows are schema-wide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from ..config.sources import SCHEMA_WIDE, TableRow

__all__ = ["SettingRows", "read_rows"]


class SettingRows:
    """The rows of one configuration table ``table``."""

    def __init__(self, table: Table) -> None:
        self.table = table
        c = table.c
        self._fields = (c.setting_name, c.value, c.unit, c.casted_as, c.note)

    def _where(self, name: str, queue: str | None) -> list[ColumnElement[bool]]:
        c = self.table.c
        where = [c.setting_name == name]
        if queue is not None:
            where.append(c.queue_name == queue)
        return where

    def rows(self, conn: Connection, *, queues: Sequence[str] | None) -> list[tuple[Any, ...]]:
        """(setting_name, value, unit, casted_as, note, queue_name) of the
        rows of ``queues``; of every row, with queue_name None, when
        ``queues`` is None."""
        if queues is None:
            return [(*row, None) for row in conn.execute(select(*self._fields))]
        c = self.table.c
        query = select(*self._fields, c.queue_name).where(c.queue_name.in_(list(queues)))
        return [tuple(row) for row in conn.execute(query)]

    def value(self, conn: Connection, *, name: str, queue: str | None) -> str | None:
        """The value of setting ``name`` (None: no row)."""
        found = conn.execute(select(self.table.c.value).where(*self._where(name, queue))).scalar()
        return None if found is None else str(found)

    def values_by_queue(
        self, conn: Connection, *, name: str, queues: Sequence[str]
    ) -> dict[str, str | None]:
        """The values of setting ``name`` of each of ``queues`` that has a row."""
        c = self.table.c
        query = select(c.queue_name, c.value).where(
            c.setting_name == name, c.queue_name.in_(list(queues))
        )
        return {str(queue): value for queue, value in conn.execute(query)}

    def value_locked(self, conn: Connection, *, name: str, queue: str | None) -> Any:
        """The row (its ``value``) of setting ``name``, locked until the
        transaction ends; None when there is none."""
        query = select(self.table.c.value).where(*self._where(name, queue)).with_for_update()
        return conn.execute(query).first()

    def value_set(self, conn: Connection, *, name: str, queue: str | None, value: str) -> None:
        conn.execute(update(self.table).where(*self._where(name, queue)).values(value=value))

    def row_insert(self, conn: Connection, *, row: Mapping[str, Any]) -> bool:
        """Insert ``row`` in a savepoint; False when another transaction
        inserted it first (a unique key's error, rolled back to the savepoint)."""
        try:
            with conn.begin_nested():
                conn.execute(insert(self.table).values(**row))
        except IntegrityError:
            return False
        return True


def read_rows(
    conn: Connection, table: Table, queue: str | None = None
) -> dict[str, TableRow] | None:
    """The rows that apply to queue table ``queue``, by setting name: those
    naming it over the schema-wide (``*``) ones; every row of a table without
    ``queue_name``. None when the table does not exist."""
    inspector = inspect(conn)
    if not inspector.has_table(table.name, schema=table.schema):
        return None
    columns = {column["name"] for column in inspector.get_columns(table.name, schema=table.schema)}
    # read before any adapter exists (its settings come from here)
    statements = SettingRows(table)
    if "queue_name" not in columns:
        # a table without the column: every row, scope None
        rows = statements.rows(conn, queues=None)
    else:
        scopes = [SCHEMA_WIDE] if queue is None else [SCHEMA_WIDE, queue]
        # the queue's own rows last: they win over the schema-wide ones
        rows = sorted(statements.rows(conn, queues=scopes), key=lambda row: row[5] != SCHEMA_WIDE)
    return {
        str(name): TableRow(str(name), value, unit, casted_as, note, scope)
        for name, value, unit, casted_as, note, scope in rows
    }
