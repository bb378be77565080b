"""Autogenerate comparison for queue and configuration tables.

One table-level comparator, run after alembic's own (``LAST`` priority on
alembic 1.18+, registration order before), for each table of the metadata:

- a queue table (``QueueMixin``): alembic's index operations on the mixin's
  indexes are taken out (alembic would make the PostgreSQL-only partial
  indexes on MySQL, and cannot compare a partial or BRIN index), and
  ``create_queue_index`` operations put in their place: every index of a new
  table, each made only on its dialects, so that the migration serves every
  database; on an existing table, the indexes of this dialect that are
  missing. A queue with unique processes (``__queue_unique__``) gets
  ``create_queue_unique_index`` when its live-key index is missing (by
  name: a changed list of processes is not seen). On PostgreSQL the NOTIFY
  trigger is compared too: missing, it is
  created; NOTIFYing another channel, ``alter_queue_channel``. A new table
  always gets ``create_queue_notify_trigger`` (nothing off PostgreSQL).
- a queue table removed from the metadata: its trigger function is dropped
  (PostgreSQL drops the trigger with the table, not the function).
- a configuration table (``ConfigurationMixin``): the declared rows that are
  not in the table are inserted; rows already there are never changed.

``include_object`` (passed to ``context.configure`` by the shipped
``env.py``) keeps the mixin's indexes out of alembic's own comparison, which
would log a "Detected added index" or "Detected changed index" line for
each index that is not made on this dialect, or that it cannot read back,
and then have its operation taken out here.

Indexes are compared by name: a changed definition under the same name
is not seen (docs/migrations.md says how to migrate one by hand).
"""

from __future__ import annotations

import re
from typing import Any

from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy import Table, select, table, text
from sqlalchemy import column as sql_column

from ..adapters.unique import (
    LIVE_KEY_COLUMN,
    live_index_name,
    live_index_names,
    live_key_statements,
)
from ..config.sources import SCHEMA_WIDE
from ..enqueue.unique import policies_of
from ..schema.configuration_table import SettingRow, configuration_rows
from ..schema.mixins import QUEUE_INDEX_INFO, notify_trigger_ddl
from .operations import (
    AlterQueueChannelOp,
    CreateQueueIndexOp,
    CreateQueueNotifyTriggerOp,
    CreateQueueUniqueIndexOp,
    DropQueueNotifyTriggerOp,
    InsertQueueSettingsOp,
    queue_index_applies,
)

_CHANNEL = re.compile(r"pg_notify\('([^']*)'")
_TRIGGER_SOURCE = text(
    "SELECT p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
    "WHERE t.tgrelid = to_regclass(:table) AND t.tgname = :trigger AND NOT t.tgisinternal"
)


def include_object(
    object_: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic's ``include_object`` hook: False for an index of the models
    that ``QueueMixin`` adds, and for the live-key index of unique tasks and
    its generated column (MySQL family), which the database has and the
    metadata does not (compared here, not by alembic); True otherwise."""
    if type_ == "index" and not reflected and QUEUE_INDEX_INFO in object_.info:
        return False
    if type_ == "column" and reflected and name == LIVE_KEY_COLUMN:
        return False
    if type_ in ("index", "unique_constraint") and reflected and name is not None:
        owner = getattr(object_, "table", None)
        return owner is None or name not in live_index_names(owner.name)
    return True


def compare_queue_tables(
    autogen_context: AutogenContext,
    modify_table_ops: ops.ModifyTableOps,
    schema: str | None,
    table_name: str,
    conn_table: Table | None,
    metadata_table: Table | None,
) -> None:
    """Alembic's ``"table"`` comparator hook (see the module docstring)."""
    if metadata_table is None:
        if conn_table is not None:
            _removed_queue_table(autogen_context, modify_table_ops, schema, table_name)
        return
    queue = metadata_table.info.get("sqla_queue")
    if queue is not None:
        _compare_queue(autogen_context, modify_table_ops, metadata_table, conn_table, queue)
    rows = configuration_rows(metadata_table)
    if rows:
        _compare_settings(autogen_context, modify_table_ops, metadata_table, conn_table, rows)


def _compare_queue(
    autogen_context: AutogenContext,
    modify_table_ops: ops.ModifyTableOps,
    metadata_table: Table,
    conn_table: Table | None,
    queue: dict[str, Any],
) -> None:
    indexes = sorted(
        (index for index in metadata_table.indexes if QUEUE_INDEX_INFO in index.info),
        key=lambda index: str(index.name),
    )
    names = {index.name for index in indexes}
    modify_table_ops.ops = [
        op
        for op in modify_table_ops.ops
        if not (isinstance(op, (ops.CreateIndexOp, ops.DropIndexOp)) and op.index_name in names)
    ]
    schema, name, channel = metadata_table.schema, metadata_table.name, queue["channel"]
    assert autogen_context.dialect is not None
    dialect = autogen_context.dialect.name
    processes = sorted(policies_of(metadata_table))
    if conn_table is None:
        modify_table_ops.ops += [CreateQueueIndexOp.from_index(index) for index in indexes]
        modify_table_ops.ops.append(
            CreateQueueNotifyTriggerOp(name, channel=channel, schema=schema)
        )
        if processes:
            modify_table_ops.ops.append(CreateQueueUniqueIndexOp(name, processes, schema=schema))
        return
    existing = {
        index["name"] for index in autogen_context.inspector.get_indexes(name, schema=schema)
    }
    modify_table_ops.ops += [
        CreateQueueIndexOp.from_index(index)
        for index in indexes
        if index.name not in existing
        and queue_index_applies(index.info[QUEUE_INDEX_INFO]["dialects"], dialect)
    ]
    if (
        processes
        and live_index_name(name) not in existing
        and live_key_statements(metadata_table, processes, autogen_context.dialect)
    ):
        modify_table_ops.ops.append(CreateQueueUniqueIndexOp(name, processes, schema=schema))
    if dialect != "postgresql":
        return
    current = _trigger_channel(autogen_context, schema, name)
    if current is None:
        modify_table_ops.ops.append(
            CreateQueueNotifyTriggerOp(name, channel=channel, schema=schema)
        )
    elif current != channel:
        modify_table_ops.ops.append(
            AlterQueueChannelOp(name, channel=channel, old_channel=current, schema=schema)
        )


def _removed_queue_table(
    autogen_context: AutogenContext,
    modify_table_ops: ops.ModifyTableOps,
    schema: str | None,
    table_name: str,
) -> None:
    assert autogen_context.dialect is not None
    if autogen_context.dialect.name != "postgresql":
        return
    channel = _trigger_channel(autogen_context, schema, table_name)
    if channel is not None:
        modify_table_ops.ops.append(
            DropQueueNotifyTriggerOp(table_name, channel=channel, schema=schema)
        )


def _trigger_channel(
    autogen_context: AutogenContext, schema: str | None, table_name: str
) -> str | None:
    """The channel the table's sqla-queue trigger NOTIFYs, None without one."""
    assert autogen_context.connection is not None
    qualified = f'"{schema}"."{table_name}"' if schema else f'"{table_name}"'
    trigger = notify_trigger_ddl(table_name, schema, table_name).trigger
    source = autogen_context.connection.execute(
        _TRIGGER_SOURCE, {"table": qualified, "trigger": trigger}
    ).scalar()
    if source is None:
        return None
    found = _CHANNEL.search(source)
    return found.group(1) if found else ""


def _compare_settings(
    autogen_context: AutogenContext,
    modify_table_ops: ops.ModifyTableOps,
    metadata_table: Table,
    conn_table: Table | None,
    rows: tuple[SettingRow, ...],
) -> None:
    # (setting, queue) of the rows the table has; a table without queue_name
    # (made before it) holds schema-wide rows only
    present: set[tuple[str, str]] = set()
    if conn_table is not None:
        assert autogen_context.connection is not None
        scoped = "queue_name" in conn_table.c
        columns: list[Any] = [sql_column("setting_name")] + [sql_column("queue_name")] * scoped
        settings = table(metadata_table.name, *columns, schema=metadata_table.schema)
        for found in autogen_context.connection.execute(select(*settings.c)):
            present.add((found[0], found[1] if scoped else SCHEMA_WIDE))
    missing = [
        row
        for row in rows
        if (row["setting_name"], row.get("queue_name", SCHEMA_WIDE)) not in present
    ]
    if missing:
        modify_table_ops.ops.append(
            InsertQueueSettingsOp(metadata_table.name, missing, schema=metadata_table.schema)
        )


def _register() -> None:
    try:  # alembic 1.18+: a priority, after alembic's own comparators
        from alembic.util import DispatchPriority
    except ImportError:  # before: in registration order, after alembic's own
        comparators.dispatch_for("table")(compare_queue_tables)
    else:
        comparators.dispatch_for("table", priority=DispatchPriority.LAST)(compare_queue_tables)


_register()
