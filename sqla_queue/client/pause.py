"""Pause and resume a process across the whole fleet.

A paused process's tasks stay queued (``pendente``, counted as ready) and no
worker claims them until it is resumed; running ones finish. The paused
processes are a row of the queue's configuration table
(``queue_configuration``, docs/configuration.md): ``setting_name =
'paused_processes'``, ``queue_name`` the queue table's name, ``value`` the
process names, comma-separated. Workers read it every
:data:`PAUSE_CHECK_SECONDS` seconds, so a pause reaches every worker of the
fleet within that time, leaderless, on every database::

    sqla-queue pause myapp.workers:Billing --process faturar
    sqla-queue resume myapp.workers:Billing --process faturar

``pause`` creates the configuration table when the schema has none (with no
rows but this one: a new table's PEQ defaults are not written, so no other
setting of the worker changes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, inspect

from ..adapters import adapter_of
from ..adapters.configuration import SettingRows
from ..common.exceptions import ConfigurationError
from ..config.sources import SCHEMA_WIDE
from ..schema.configuration_table import configuration_table_of, has_queue_name

__all__ = ["PAUSED_SETTING", "PAUSE_CHECK_SECONDS", "pause", "paused_processes", "resume"]

PAUSED_SETTING = "paused_processes"
#: how often a worker reads the paused processes
PAUSE_CHECK_SECONDS = 2.0


def _split(value: str | None) -> frozenset[str]:
    return frozenset(name.strip() for name in (value or "").split(",") if name.strip())


def _of(conn: Connection, queue: Any) -> tuple[Table, SettingRows, str]:
    """The configuration table of a queue model (or of a queue Table: the
    schema's ``queue_configuration``), its rows' statements and the queue's
    name."""
    if isinstance(queue, Table):
        table, queue_table = configuration_table_of(_TableOnly(queue)), queue
    else:
        table, queue_table = configuration_table_of(queue), queue.__table__
    return table, adapter_of(conn.dialect, queue_table).settings(table), queue_table.name


class _TableOnly:
    def __init__(self, table: Table) -> None:
        self.__table__ = table


def paused_processes(conn: Connection, model: Any) -> frozenset[str]:
    """The processes of ``model``'s queue (a model, or its Table) paused
    now (its own row over the schema-wide one); empty when there is no
    configuration table."""
    table, rows, queue = _of(conn, model)
    if not inspect(conn).has_table(table.name, schema=table.schema):
        return frozenset()
    return _read(conn, rows, queue if has_queue_name(conn, table) else None)


def _read(conn: Connection, rows: SettingRows, queue: str | None) -> frozenset[str]:
    """``queue``: None when the table has no ``queue_name``."""
    if queue is None:
        return _split(rows.value(conn, name=PAUSED_SETTING, queue=None))
    found = rows.values_by_queue(conn, name=PAUSED_SETTING, queues=[queue, SCHEMA_WIDE])
    return _split(found.get(queue, found.get(SCHEMA_WIDE)))


def pause(conn: Connection, model: Any, processes: Iterable[str]) -> frozenset[str]:
    """Pause ``processes`` of ``model``'s queue, in the caller's
    transaction; returns every paused process."""
    return _change(conn, model, set(processes), add=True)


def resume(conn: Connection, model: Any, processes: Iterable[str]) -> frozenset[str]:
    """Resume ``processes``; returns the processes still paused."""
    return _change(conn, model, set(processes), add=False)


def _change(conn: Connection, model: Any, names: set[str], *, add: bool) -> frozenset[str]:
    for name in names:
        if not name or "," in name or len(name) > 250:
            raise ConfigurationError(
                f"process {name!r}: give a processo value (no comma, at most 250 characters)"
            )
    table, rows, name = _of(conn, model)
    table.create(conn, checkfirst=True)
    queue = name if has_queue_name(conn, table) else None
    for _ in range(2):  # a concurrent first pause inserts the row: then update it
        current = rows.value_locked(conn, name=PAUSED_SETTING, queue=queue)
        now = _read(conn, rows, queue) if current is None else _split(current[0])
        paused = now | names if add else now - names
        value = ",".join(sorted(paused))
        if current is not None:
            rows.value_set(conn, name=PAUSED_SETTING, queue=queue, value=value)
            return frozenset(paused)
        row = {
            "setting_name": PAUSED_SETTING,
            "value": value,
            "casted_as": "TEXT",
            "unit": None,
            "note": "processes no worker claims (sqla-queue pause / resume)",
        }
        if queue is not None:
            row["queue_name"] = queue
        if rows.row_insert(conn, row=row):
            return frozenset(paused)
    raise ConfigurationError("the paused processes changed twice under this call: try again")
