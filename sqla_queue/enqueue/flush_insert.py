"""The flush hook's fast path: new tasks written by Core statements.

A task added with ``session.add(Task(...))`` is, to the ORM's unit of work,
a 27-column object to sort, diff, compile and post-fetch: about half of an
enqueue's time on PostgreSQL (docs/benchmarks.md). The flush hook
(``events.py``) completes the new tasks; then, for each one this module can
take, it inserts the row itself through the adapter's direct INSERT (the
statement ``QueueClient.insert_task`` runs: compiled once, run on the
connection's own cursor in the session's transaction) and hands the object
to the session as the flush would have: its ``id`` set, its history
committed, in the identity map and in the transaction's new objects (so a
rollback expunges it as it would a flushed one), ``pending_to_persistent``
fired, and the columns the database filled (server defaults) expired, to be
loaded on first access as after an ordinary flush with ``eager_defaults``
off.

Tasks are left to the ordinary flush, unchanged, when anything could make
the two differ: the model has relationships, foreign keys, inheritance, a
version counter, ``eager_defaults``, or its own ``before_insert`` /
``after_insert`` listeners; or the task has an explicit id or an SQL
expression as a value. Off by default it is not: it is the path every
plain queue model takes. ``SQLA_QUEUE_ORM_FAST_INSERT=false`` turns it off.

Written before the flush's own INSERTs, a task row precedes the business
rows of the same flush; with no foreign key on the queue table (a condition
above), the order is not observable inside the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Table, inspect
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.sql import ClauseElement

from ..adapters import adapter_of
from ..adapters.sqla_private import can_register_persistent, register_persistent
from ..config.kinds import EnvFlag
from ..schema.mixins import QueueMixin

__all__ = ["write_new_tasks"]

_eligible_mappers: dict[Mapper[Any], bool] = {}
#: ``SQLA_QUEUE_ORM_FAST_INSERT`` (default true); a value that is not a
#: boolean is a ``ConfigurationError`` (the flush, and so its transaction,
#: fails with nothing written)
enabled = EnvFlag("SQLA_QUEUE_ORM_FAST_INSERT", default=True)


def _eligible(mapper: Mapper[Any]) -> bool:
    known = _eligible_mappers.get(mapper)
    if known is None:
        from .events import _refuse_unprepared_insert

        table = mapper.local_table
        before = [
            fn for fn in mapper.dispatch.before_insert if not _is(fn, _refuse_unprepared_insert)
        ]
        known = _eligible_mappers[mapper] = bool(
            isinstance(table, Table)
            and mapper.inherits is None
            and not mapper.polymorphic_map
            and not mapper.relationships
            and not table.foreign_keys
            and mapper.version_id_col is None
            and mapper.eager_defaults is False
            and not before
            and not list(mapper.dispatch.after_insert)
            and can_register_persistent()
        )
    return known


def _is(listener: Any, fn: Any) -> bool:
    """Whether ``listener`` is ``fn``, or the wrapper the mapper events put
    around it (a closure over it)."""
    cells = getattr(listener, "__closure__", None) or ()
    return listener is fn or any(_cell(cell) is fn for cell in cells)


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


#: per mapper: (attribute key, column name, primary key?, filled by the
#: database when no value is given, the primary key aside?) of each column
_plans: dict[Mapper[Any], tuple[tuple[str, str, bool, bool], ...]] = {}


def _plan(mapper: Mapper[Any]) -> tuple[tuple[str, str, bool, bool], ...]:
    plan = _plans.get(mapper)
    if plan is None:
        plan = _plans[mapper] = tuple(
            (
                prop.key,
                column.name,
                bool(column.primary_key),
                not column.primary_key and column.server_default is not None,
            )
            for prop in mapper.column_attrs
            for column in prop.columns[:1]
        )
    return plan


def _row(mapper: Mapper[Any], task: QueueMixin) -> tuple[dict[str, Any], list[str]] | None:
    """The task's column values by column name, and the attributes the
    database fills other than the primary key (to expire); None when the ORM
    must write it."""
    values = task.__dict__
    row: dict[str, Any] = {}
    filled: list[str] = []
    for key, name, primary_key, server_filled in _plan(mapper):
        value = values.get(key)
        if value is None:
            if server_filled:
                filled.append(key)
            continue
        if primary_key or isinstance(value, ClauseElement):
            return None  # an id chosen by the application, or SQL: the ORM's path
        row[name] = value
    return row, filled


def write_new_tasks(session: Session, tasks: Iterable[QueueMixin]) -> None:
    """Insert the new tasks this module can take and make them persistent.

    Consecutive tasks of one model that give the same columns go in one
    statement (``task_insert_many``: one round trip for the three tasks of
    an order, not three), in the order they were added, so their ids keep
    that order; a task the ORM must write ends the run."""
    if not enabled():
        return
    run: list[tuple[Any, dict[str, Any], list[str]]] = []
    run_key: tuple[Any, ...] | None = None
    for task in tasks:
        state = inspect(task)
        mapper = state.mapper
        prepared = None
        if state.key is None and _eligible(mapper):
            prepared = _row(mapper, task)
        if prepared is None:
            _write(session, run)
            run, run_key = [], None
            continue
        row, filled = prepared
        key = (mapper, tuple(row))
        if key != run_key:
            _write(session, run)
            run, run_key = [], key
        run.append((state, row, filled))
    _write(session, run)


def _write(session: Session, run: list[tuple[Any, dict[str, Any], list[str]]]) -> None:
    """Insert ``run`` (tasks of one mapper giving the same columns), set their
    ids, and hand them to the session as its flush would have."""
    if not run:
        return
    mapper = run[0][0].mapper
    conn = session.connection(bind_arguments={"mapper": mapper})
    table = mapper.local_table
    assert isinstance(table, Table)
    adapter = adapter_of(conn.dialect, table)
    if len(run) == 1:
        new_ids = [adapter.task_insert_one(conn, row=run[0][1])]
    else:
        new_ids = adapter.task_insert_many(conn, rows=[row for _, row, _ in run])
    id_key = mapper.get_property_by_column(mapper.primary_key[0]).key
    for (state, _, _), new_id in zip(run, new_ids, strict=True):
        state.dict[id_key] = new_id
    register_persistent(session, {state for state, _, _ in run})
    for state, _, filled in run:
        if filled:
            session.expire(state.obj(), filled)
