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

from sqlalchemy import Connection, Table, inspect, select, update
from sqlalchemy.exc import IntegrityError

from .catalog import SCHEMA_WIDE
from .configuration_table import configuration_table_of, has_queue_name
from .exceptions import ConfigurationError

__all__ = ["PAUSED_SETTING", "PAUSE_CHECK_SECONDS", "pause", "paused_processes", "resume"]

PAUSED_SETTING = "paused_processes"
#: how often a worker reads the paused processes
PAUSE_CHECK_SECONDS = 2.0


def _split(value: str | None) -> frozenset[str]:
    return frozenset(name.strip() for name in (value or "").split(",") if name.strip())


def _of(queue: Any) -> tuple[Table, str]:
    """The configuration table of a queue model (or of a queue Table: the
    schema's ``queue_configuration``) and the queue's name."""
    if isinstance(queue, Table):
        return configuration_table_of(_TableOnly(queue)), queue.name
    return configuration_table_of(queue), queue.__table__.name


class _TableOnly:
    def __init__(self, table: Table) -> None:
        self.__table__ = table


def paused_processes(conn: Connection, model: Any) -> frozenset[str]:
    """The processes of ``model``'s queue (a model, or its Table) paused
    now (its own row over the schema-wide one); empty when there is no
    configuration table."""
    table, queue = _of(model)
    if not inspect(conn).has_table(table.name, schema=table.schema):
        return frozenset()
    return _read(conn, table, queue, scoped=has_queue_name(conn, table))


def _read(conn: Connection, table: Table, queue: str, *, scoped: bool) -> frozenset[str]:
    c = table.c
    query = select(c.value).where(c.setting_name == PAUSED_SETTING)
    if not scoped:
        return _split(conn.execute(query).scalar())
    rows = dict(
        conn.execute(
            select(c.queue_name, c.value).where(
                c.setting_name == PAUSED_SETTING, c.queue_name.in_([queue, SCHEMA_WIDE])
            )
        ).all()
    )
    return _split(rows.get(queue, rows.get(SCHEMA_WIDE)))


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
    table, queue = _of(model)
    table.create(conn, checkfirst=True)
    scoped = has_queue_name(conn, table)
    c = table.c
    where = [c.setting_name == PAUSED_SETTING]
    if scoped:
        where.append(c.queue_name == queue)
    for _ in range(2):  # a concurrent first pause inserts the row: then update it
        current = conn.execute(select(c.value).where(*where).with_for_update()).first()
        now = _read(conn, table, queue, scoped=scoped) if current is None else _split(current[0])
        paused = now | names if add else now - names
        value = ",".join(sorted(paused))
        if current is not None:
            conn.execute(update(table).where(*where).values(value=value))
            return frozenset(paused)
        row = {
            "setting_name": PAUSED_SETTING,
            "value": value,
            "casted_as": "TEXT",
            "unit": None,
            "note": "processes no worker claims (sqla-queue pause / resume)",
        }
        if scoped:
            row["queue_name"] = queue
        try:
            with conn.begin_nested():
                conn.execute(table.insert().values(**row))
        except IntegrityError:
            continue
        return frozenset(paused)
    raise ConfigurationError("the paused processes changed twice under this call: try again")
