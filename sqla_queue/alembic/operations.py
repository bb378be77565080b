"""Alembic operations for what autogenerate cannot see on a queue table.

Registered with ``Operations.register_operation``, so a migration calls them
as ``op.create_queue_index(...)`` once ``sqla_queue.alembic`` is imported
(the shipped ``script.py.mako`` does, and so does every migration that
autogenerate writes with them). Each has a renderer for autogenerate and a
``reverse()`` for the downgrade.

- ``create_queue_index`` / ``drop_queue_index``: the indexes ``QueueMixin``
  adds, as it makes them: partial (``where``) on PostgreSQL and SQLite, BRIN
  (``using``) on PostgreSQL, and made only on the dialects they are for
  (``dialects``), so one migration serves every database.
- ``create_queue_unique_index`` / ``drop_queue_unique_index``: the
  live-key index of a queue's unique processes (docs/unique.md): a partial
  unique index on PostgreSQL and SQLite, a generated column and its unique
  index on the MySQL family, nothing on SingleStore.
- ``create_queue_notify_trigger`` / ``drop_queue_notify_trigger``: the
  PostgreSQL NOTIFY function and trigger (nothing elsewhere).
- ``alter_queue_channel``: the channel the trigger NOTIFYs.
- ``rename_queue_table``: the table, its indexes, its trigger and channel.
- ``insert_queue_settings`` / ``delete_queue_settings``: rows of the PEQ
  configuration table.

The SQL comes from the mixins (``notify_trigger_ddl``, the indexes'
``Index.info``), never from a second copy here. Every operation also runs
offline (``alembic upgrade --sql``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, Operations
from sqlalchemy import Column, Index, MetaData, String, Table, Text, column, inspect, table, text
from sqlalchemy.dialects import postgresql

from ..adapters.unique import live_index_names, live_key_drop_statements, live_key_statements
from ..common.identifiers import derived_identifier, validate_identifier
from ..schema.configuration_table import SettingRow
from ..schema.mixins import COMPANION_INDEX_INFO, QUEUE_INDEX_INFO, notify_trigger_ddl

__all__ = [
    "AlterQueueChannelOp",
    "CreateQueueIndexOp",
    "CreateQueueNotifyTriggerOp",
    "CreateQueueUniqueIndexOp",
    "DeleteQueueSettingsOp",
    "DropQueueIndexOp",
    "DropQueueNotifyTriggerOp",
    "DropQueueUniqueIndexOp",
    "InsertQueueSettingsOp",
    "RenameQueueTableOp",
    "queue_index_applies",
]

IMPORT = "import sqla_queue.alembic  # noqa: F401 (registers the op.*_queue_* operations)"


def queue_index_applies(dialects: Sequence[str] | None, dialect_name: str) -> bool:
    """Whether an index made on ``dialects`` (None: all) is made on this one."""
    return dialects is None or dialect_name in dialects


def _dialect_name(operations: Operations) -> str:
    return operations.get_context().dialect.name


def _call(autogen_context: AutogenContext, name: str, *args: Any, **kwargs: Any) -> str:
    """``op.name(args, key=value)`` for a renderer, keyword arguments left out
    when None; and the import that registers the operation."""
    autogen_context.imports.add(IMPORT)
    prefix = autogen_context.opts.get("alembic_module_prefix", "op.")
    rendered = [repr(arg) for arg in args]
    rendered += [f"{key}={value!r}" for key, value in kwargs.items() if value is not None]
    return f"{prefix}{name}({', '.join(rendered)})"


# ------------------------------------------------------------------ indexes
class _QueueIndexOp(MigrateOperation):
    def __init__(
        self,
        index_name: str,
        table_name: str,
        columns: Sequence[str] = (),
        *,
        schema: str | None = None,
        where: str | None = None,
        using: str | None = None,
        dialects: Sequence[str] | None = None,
    ) -> None:
        self.index_name = index_name
        self.table_name = table_name
        self.columns = list(columns)
        self.schema = schema
        self.where = where
        self.using = using
        self.dialects = list(dialects) if dialects is not None else None

    def _arguments(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "where": self.where,
            "using": self.using,
            "dialects": self.dialects,
        }

    def _render(self, autogen_context: AutogenContext, name: str) -> str:
        return _call(
            autogen_context,
            name,
            self.index_name,
            self.table_name,
            self.columns,
            **self._arguments(),
        )


@Operations.register_operation("create_queue_index")
class CreateQueueIndexOp(_QueueIndexOp):
    """Create one of QueueMixin's indexes where it is made.

    ``columns`` are column names or SQL expressions (``"prioridade DESC"``);
    ``where`` makes it partial on PostgreSQL and SQLite; ``using`` is the
    PostgreSQL access method (``"brin"``); ``dialects`` names the dialects
    it is made on (None: all)."""

    @classmethod
    def create_queue_index(
        cls,
        operations: Operations,
        index_name: str,
        table_name: str,
        columns: Sequence[str],
        *,
        schema: str | None = None,
        where: str | None = None,
        using: str | None = None,
        dialects: Sequence[str] | None = None,
    ) -> None:
        """Create one of QueueMixin's indexes (on ``dialects`` only)."""
        operations.invoke(
            cls(
                index_name,
                table_name,
                columns,
                schema=schema,
                where=where,
                using=using,
                dialects=dialects,
            )
        )

    @classmethod
    def from_index(cls, index: Index) -> CreateQueueIndexOp:
        """The operation that makes ``index``, one the mixin added."""
        sql = postgresql.dialect()  # type: ignore[no-untyped-call]
        kwargs = {"literal_binds": True, "include_table": False}
        columns = [
            expression
            if isinstance(expression, str)
            else expression.name
            if isinstance(expression, Column)
            else str(expression.compile(dialect=sql, compile_kwargs=kwargs))
            for expression in index.expressions
        ]
        options = index.dialect_options["postgresql"]
        where = options["where"]
        assert index.table is not None and index.name is not None
        return cls(
            str(index.name),
            index.table.name,
            columns,
            schema=index.table.schema,
            where=None if where is None else str(where.compile(dialect=sql, compile_kwargs=kwargs)),
            using=options["using"] or None,
            dialects=index.info[QUEUE_INDEX_INFO]["dialects"],
        )

    def reverse(self) -> DropQueueIndexOp:
        return DropQueueIndexOp(self.index_name, self.table_name, self.columns, **self._arguments())

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_queue_index", self.schema, self.table_name, self.index_name)


@Operations.register_operation("drop_queue_index")
class DropQueueIndexOp(_QueueIndexOp):
    """Drop one of QueueMixin's indexes (on ``dialects`` only)."""

    @classmethod
    def drop_queue_index(
        cls,
        operations: Operations,
        index_name: str,
        table_name: str,
        columns: Sequence[str] = (),
        *,
        schema: str | None = None,
        where: str | None = None,
        using: str | None = None,
        dialects: Sequence[str] | None = None,
    ) -> None:
        """Drop one of QueueMixin's indexes (on ``dialects`` only; the
        other arguments are kept so the operation can be reversed)."""
        operations.invoke(
            cls(
                index_name,
                table_name,
                columns,
                schema=schema,
                where=where,
                using=using,
                dialects=dialects,
            )
        )

    def reverse(self) -> CreateQueueIndexOp:
        if not self.columns:
            raise ValueError(f"drop_queue_index({self.index_name!r}) without columns: no reverse")
        return CreateQueueIndexOp(
            self.index_name, self.table_name, self.columns, **self._arguments()
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_queue_index", self.schema, self.table_name, self.index_name)


def _index_kwargs(op: _QueueIndexOp) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"schema": op.schema}
    if op.where is not None:
        kwargs["postgresql_where"] = kwargs["sqlite_where"] = text(op.where)
    if op.using is not None:
        kwargs["postgresql_using"] = op.using
    return kwargs


def _index_columns(columns: Sequence[str]) -> list[Any]:
    # a plain name stays a column (quoted if it must be), anything else is SQL
    return [name if name.isidentifier() else text(name) for name in columns]


@Operations.implementation_for(CreateQueueIndexOp)
def _create_queue_index(operations: Operations, op: CreateQueueIndexOp) -> None:
    if queue_index_applies(op.dialects, _dialect_name(operations)):
        operations.create_index(
            op.index_name, op.table_name, _index_columns(op.columns), **_index_kwargs(op)
        )


@Operations.implementation_for(DropQueueIndexOp)
def _drop_queue_index(operations: Operations, op: DropQueueIndexOp) -> None:
    if queue_index_applies(op.dialects, _dialect_name(operations)):
        operations.drop_index(op.index_name, table_name=op.table_name, schema=op.schema)


@renderers.dispatch_for(CreateQueueIndexOp)
def _render_create_queue_index(autogen_context: AutogenContext, op: CreateQueueIndexOp) -> str:
    return op._render(autogen_context, "create_queue_index")


@renderers.dispatch_for(DropQueueIndexOp)
def _render_drop_queue_index(autogen_context: AutogenContext, op: DropQueueIndexOp) -> str:
    return op._render(autogen_context, "drop_queue_index")


# ------------------------------------------------------- live-key index
class _UniqueIndexOp(MigrateOperation):
    def __init__(
        self, table_name: str, processes: Sequence[str], *, schema: str | None = None
    ) -> None:
        self.table_name = validate_identifier(table_name, "table name")
        self.processes = sorted(processes)
        self.schema = schema

    def _table(self) -> Table:
        return Table(self.table_name, MetaData(), schema=self.schema)

    def _render(self, autogen_context: AutogenContext, name: str) -> str:
        return _call(autogen_context, name, self.table_name, self.processes, schema=self.schema)


@Operations.register_operation("create_queue_unique_index")
class CreateQueueUniqueIndexOp(_UniqueIndexOp):
    """Make the live-key index of a queue table's unique processes
    (``processes``: the names its model's ``__queue_unique__`` declares):
    a partial unique index on PostgreSQL and SQLite, a stored generated
    column and its unique index on MariaDB/MySQL (a table rebuild there),
    nothing on SingleStore. Fails, and makes nothing, while two live tasks
    share a key (docs/unique.md says how to find them)."""

    @classmethod
    def create_queue_unique_index(
        cls,
        operations: Operations,
        table_name: str,
        processes: Sequence[str],
        *,
        schema: str | None = None,
    ) -> None:
        """Make the live-key index of ``processes`` on ``table_name``."""
        operations.invoke(cls(table_name, processes, schema=schema))

    def reverse(self) -> DropQueueUniqueIndexOp:
        return DropQueueUniqueIndexOp(self.table_name, self.processes, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_queue_unique_index", self.schema, self.table_name, tuple(self.processes))


@Operations.register_operation("drop_queue_unique_index")
class DropQueueUniqueIndexOp(_UniqueIndexOp):
    """Drop a queue table's live-key index (and, on the MySQL family, its
    generated column); ``processes`` is kept for the reverse. To change
    the unique processes, drop it and create it with the new list."""

    @classmethod
    def drop_queue_unique_index(
        cls,
        operations: Operations,
        table_name: str,
        processes: Sequence[str] = (),
        *,
        schema: str | None = None,
    ) -> None:
        """Drop the live-key index of ``table_name``."""
        operations.invoke(cls(table_name, processes, schema=schema))

    def reverse(self) -> CreateQueueUniqueIndexOp:
        if not self.processes:
            raise ValueError(f"drop_queue_unique_index({self.table_name!r}) without processes")
        return CreateQueueUniqueIndexOp(self.table_name, self.processes, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_queue_unique_index", self.schema, self.table_name, tuple(self.processes))


@Operations.implementation_for(CreateQueueUniqueIndexOp)
def _create_unique_index(operations: Operations, op: CreateQueueUniqueIndexOp) -> None:
    dialect = operations.get_context().dialect
    for statement in live_key_statements(op._table(), op.processes, dialect):
        operations.execute(statement)


@Operations.implementation_for(DropQueueUniqueIndexOp)
def _drop_unique_index(operations: Operations, op: DropQueueUniqueIndexOp) -> None:
    dialect = operations.get_context().dialect
    for statement in live_key_drop_statements(op._table(), dialect):
        operations.execute(statement)


@renderers.dispatch_for(CreateQueueUniqueIndexOp)
def _render_create_unique_index(
    autogen_context: AutogenContext, op: CreateQueueUniqueIndexOp
) -> str:
    return op._render(autogen_context, "create_queue_unique_index")


@renderers.dispatch_for(DropQueueUniqueIndexOp)
def _render_drop_unique_index(autogen_context: AutogenContext, op: DropQueueUniqueIndexOp) -> str:
    return op._render(autogen_context, "drop_queue_unique_index")


# ------------------------------------------------------- NOTIFY trigger
class _TriggerOp(MigrateOperation):
    def __init__(self, table_name: str, *, channel: str, schema: str | None = None) -> None:
        self.table_name = table_name
        self.channel = channel
        self.schema = schema

    def _execute(self, operations: Operations, *statements: str) -> None:
        if _dialect_name(operations) == "postgresql":
            for statement in statements:
                operations.execute(statement)


@Operations.register_operation("create_queue_notify_trigger")
class CreateQueueNotifyTriggerOp(_TriggerOp):
    """Create the NOTIFY function and trigger of a queue table (PostgreSQL;
    nothing on other databases, which have no NOTIFY)."""

    @classmethod
    def create_queue_notify_trigger(
        cls, operations: Operations, table_name: str, *, channel: str, schema: str | None = None
    ) -> None:
        """Create the NOTIFY function and trigger of a queue table (PostgreSQL)."""
        operations.invoke(cls(table_name, channel=channel, schema=schema))

    def reverse(self) -> DropQueueNotifyTriggerOp:
        return DropQueueNotifyTriggerOp(self.table_name, channel=self.channel, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_queue_notify_trigger", self.schema, self.table_name, self.channel)


@Operations.register_operation("drop_queue_notify_trigger")
class DropQueueNotifyTriggerOp(_TriggerOp):
    """Drop the NOTIFY trigger and function of a queue table (PostgreSQL)."""

    @classmethod
    def drop_queue_notify_trigger(
        cls, operations: Operations, table_name: str, *, channel: str, schema: str | None = None
    ) -> None:
        """Drop the NOTIFY trigger and function of a queue table (PostgreSQL;
        ``channel`` is kept so the operation can be reversed)."""
        operations.invoke(cls(table_name, channel=channel, schema=schema))

    def reverse(self) -> CreateQueueNotifyTriggerOp:
        return CreateQueueNotifyTriggerOp(self.table_name, channel=self.channel, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_queue_notify_trigger", self.schema, self.table_name, self.channel)


@Operations.implementation_for(CreateQueueNotifyTriggerOp)
def _create_trigger(operations: Operations, op: CreateQueueNotifyTriggerOp) -> None:
    ddl = notify_trigger_ddl(op.table_name, op.schema, op.channel)
    op._execute(operations, ddl.create_function, ddl.create_trigger, ddl.set_storage)


@Operations.implementation_for(DropQueueNotifyTriggerOp)
def _drop_trigger(operations: Operations, op: DropQueueNotifyTriggerOp) -> None:
    ddl = notify_trigger_ddl(op.table_name, op.schema, op.channel)
    op._execute(operations, ddl.drop_trigger, ddl.drop_function)


@renderers.dispatch_for(CreateQueueNotifyTriggerOp)
def _render_create_trigger(autogen_context: AutogenContext, op: _TriggerOp) -> str:
    return _call(
        autogen_context,
        "create_queue_notify_trigger",
        op.table_name,
        channel=op.channel,
        schema=op.schema,
    )


@renderers.dispatch_for(DropQueueNotifyTriggerOp)
def _render_drop_trigger(autogen_context: AutogenContext, op: _TriggerOp) -> str:
    return _call(
        autogen_context,
        "drop_queue_notify_trigger",
        op.table_name,
        channel=op.channel,
        schema=op.schema,
    )


@Operations.register_operation("alter_queue_channel")
class AlterQueueChannelOp(_TriggerOp):
    """Make a queue table's trigger NOTIFY ``channel`` instead of
    ``old_channel`` (PostgreSQL; workers LISTEN on the channel, so deploy
    them with the new one)."""

    def __init__(
        self, table_name: str, *, channel: str, old_channel: str, schema: str | None = None
    ) -> None:
        super().__init__(table_name, channel=channel, schema=schema)
        self.old_channel = old_channel

    @classmethod
    def alter_queue_channel(
        cls,
        operations: Operations,
        table_name: str,
        *,
        channel: str,
        old_channel: str,
        schema: str | None = None,
    ) -> None:
        """Make the table's NOTIFY trigger use ``channel`` (PostgreSQL)."""
        operations.invoke(cls(table_name, channel=channel, old_channel=old_channel, schema=schema))

    def reverse(self) -> AlterQueueChannelOp:
        return AlterQueueChannelOp(
            self.table_name, channel=self.old_channel, old_channel=self.channel, schema=self.schema
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("alter_queue_channel", self.schema, self.table_name, self.old_channel, self.channel)


@Operations.implementation_for(AlterQueueChannelOp)
def _alter_channel(operations: Operations, op: AlterQueueChannelOp) -> None:
    # CREATE OR REPLACE: the trigger keeps calling the same function
    op._execute(
        operations, notify_trigger_ddl(op.table_name, op.schema, op.channel).create_function
    )


@renderers.dispatch_for(AlterQueueChannelOp)
def _render_alter_channel(autogen_context: AutogenContext, op: AlterQueueChannelOp) -> str:
    return _call(
        autogen_context,
        "alter_queue_channel",
        op.table_name,
        channel=op.channel,
        old_channel=op.old_channel,
        schema=op.schema,
    )


# ------------------------------------------------------------------ rename
@Operations.register_operation("rename_queue_table")
class RenameQueueTableOp(MigrateOperation):
    """Rename a queue table with what its name is part of: the mixin's
    indexes (``ix_<table>_*``), the NOTIFY trigger and function, and the
    channel (by default the table's name, as the mixin's default)."""

    def __init__(
        self,
        old_table_name: str,
        new_table_name: str,
        *,
        schema: str | None = None,
        channel: str | None = None,
        old_channel: str | None = None,
    ) -> None:
        self.old_table_name = validate_identifier(old_table_name, "table name")
        self.new_table_name = validate_identifier(new_table_name, "table name")
        self.schema = schema
        self.channel = channel or new_table_name
        self.old_channel = old_channel or old_table_name

    @classmethod
    def rename_queue_table(
        cls,
        operations: Operations,
        old_table_name: str,
        new_table_name: str,
        *,
        schema: str | None = None,
        channel: str | None = None,
        old_channel: str | None = None,
    ) -> None:
        """Rename a queue table, its indexes, trigger and channel (``channel``:
        the new one, default the new table name; ``old_channel``: the one
        the trigger NOTIFYs now, default the old table name)."""
        operations.invoke(
            cls(
                old_table_name,
                new_table_name,
                schema=schema,
                channel=channel,
                old_channel=old_channel,
            )
        )

    def reverse(self) -> RenameQueueTableOp:
        return RenameQueueTableOp(
            self.new_table_name,
            self.old_table_name,
            schema=self.schema,
            channel=self.old_channel,
            old_channel=self.channel,
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("rename_queue_table", self.schema, self.old_table_name, self.new_table_name)


@Operations.implementation_for(RenameQueueTableOp)
def _rename_queue_table(operations: Operations, op: RenameQueueTableOp) -> None:
    from .ddl import queue_tables  # the ddl module imports the mixins' models

    dialect = _dialect_name(operations)
    old = notify_trigger_ddl(op.old_table_name, op.schema, op.old_channel)
    new = notify_trigger_ddl(op.new_table_name, op.schema, op.channel)
    postgres = dialect == "postgresql"
    if postgres:
        operations.execute(old.drop_trigger)
        operations.execute(old.drop_function)
    operations.rename_table(op.old_table_name, op.new_table_name, schema=op.schema)
    quote = operations.get_context().dialect.identifier_preparer.quote
    owner = f"{quote(op.schema)}." if op.schema else ""
    renamed = queue_tables(op.schema, op.new_table_name)[0]
    for index in sorted(renamed.indexes, key=lambda i: str(i.name)):
        info = index.info[QUEUE_INDEX_INFO]
        if not queue_index_applies(info["dialects"], dialect):
            continue
        old_name = derived_identifier(op.old_table_name, info["suffix"], "ix_")
        new_name = str(index.name)
        if postgres:
            operations.execute(f"ALTER INDEX {owner}{quote(old_name)} RENAME TO {quote(new_name)}")
        elif dialect == "sqlite":  # no RENAME INDEX: made again under its new name
            operations.drop_index(old_name, table_name=op.new_table_name, schema=op.schema)
            operations.invoke(CreateQueueIndexOp.from_index(index))
        else:
            operations.execute(
                f"ALTER TABLE {owner}{quote(op.new_table_name)} "
                f"RENAME INDEX {quote(old_name)} TO {quote(new_name)}"
            )
    if postgres:
        operations.execute(new.create_function)
        operations.execute(new.create_trigger)
    _rename_live_index(operations, op)
    _rename_companions(operations, op)


def _rename_live_index(operations: Operations, op: RenameQueueTableOp) -> None:
    """The live-key index (unique tasks), where the table has one: renamed
    (SQLite has no RENAME INDEX: made again from its own SQL). Offline, as
    the companions, by hand."""
    if operations.get_context().as_sql:
        return
    bind = operations.get_bind()
    found = {ix["name"] for ix in inspect(bind).get_indexes(op.new_table_name, schema=op.schema)}
    for old_name, new_name in zip(
        live_index_names(op.old_table_name), live_index_names(op.new_table_name), strict=True
    ):
        if old_name in found:
            _rename_index(operations, op, old_name, new_name)


def _rename_index(
    operations: Operations,
    op: RenameQueueTableOp,
    old_name: str,
    new_name: str,
    table_name: str | None = None,
) -> None:
    """Index ``old_name`` of ``table_name`` (the renamed queue table by
    default) renamed ``new_name``."""
    table_name = table_name or op.new_table_name
    bind = operations.get_bind()
    dialect = bind.dialect.name
    quote = bind.dialect.identifier_preparer.quote
    owner = f"{quote(op.schema)}." if op.schema else ""
    if dialect == "postgresql":
        operations.execute(f"ALTER INDEX {owner}{quote(old_name)} RENAME TO {quote(new_name)}")
    elif dialect == "sqlite":
        master = f"{owner}sqlite_master"
        sql = bind.execute(
            text(f"SELECT sql FROM {master} WHERE type = 'index' AND name = :name"),
            {"name": old_name},
        ).scalar_one()
        operations.execute(f"DROP INDEX {owner}{quote(old_name)}")
        # the index's name is the first name in its CREATE INDEX
        operations.execute(str(sql).replace(old_name, new_name, 1))
    else:
        operations.execute(
            f"ALTER TABLE {owner}{quote(table_name)} "
            f"RENAME INDEX {quote(old_name)} TO {quote(new_name)}"
        )


def _rename_companions(operations: Operations, op: RenameQueueTableOp) -> None:
    """The tables that go with a queue table, where the database has them:
    ``<table>_status`` (status's kept counts), ``<table>_unique`` (unique
    tasks' keys), ``<table>_wf_steps``, ``_wf_edges`` and ``_wf_gates`` (workflows).
    Offline (``--sql``) the database cannot be asked: rename them by hand
    there."""
    from .ddl import queue_tables  # the ddl module imports the mixins' models

    if operations.get_context().as_sql:
        return
    inspector = inspect(operations.get_bind())
    renamed = {table.name: table for table in queue_tables(op.schema, op.new_table_name)}
    for suffix in ("status", "unique", "wf_steps", "wf_edges", "wf_gates"):
        old_name = derived_identifier(op.old_table_name, suffix, "")
        if inspector.has_table(old_name, schema=op.schema):
            new_name = derived_identifier(op.new_table_name, suffix, "")
            operations.rename_table(old_name, new_name, schema=op.schema)
            table = renamed.get(new_name)
            for index in [] if table is None else sorted(table.indexes, key=lambda i: str(i.name)):
                old_index = derived_identifier(old_name, index.info[COMPANION_INDEX_INFO], "ix_")
                _rename_index(operations, op, old_index, str(index.name), new_name)


@renderers.dispatch_for(RenameQueueTableOp)
def _render_rename(autogen_context: AutogenContext, op: RenameQueueTableOp) -> str:
    return _call(
        autogen_context,
        "rename_queue_table",
        op.old_table_name,
        op.new_table_name,
        schema=op.schema,
        channel=op.channel,
        old_channel=op.old_channel,
    )


# ---------------------------------------------------------------- settings
def _settings_table(table_name: str, schema: str | None, queue_name: bool = False) -> Any:
    """The columns of a configuration table the rows give (``queue_name``
    only when they name their queue: an older table lacks the column)."""
    return table(
        table_name,
        column("setting_name", String),
        *[column("queue_name", String)] * queue_name,
        column("value", String),
        column("unit", String),
        column("casted_as", String),
        column("note", Text),
        schema=schema,
    )


class _SettingsOp(MigrateOperation):
    def __init__(
        self, table_name: str, rows: Sequence[Mapping[str, Any]], *, schema: str | None = None
    ) -> None:
        self.table_name = table_name
        self.rows = [dict(row) for row in rows]
        self.schema = schema


@Operations.register_operation("insert_queue_settings")
class InsertQueueSettingsOp(_SettingsOp):
    """Insert rows into a PEQ configuration table (the rows a new table starts
    with; existing rows are the operators' and are never touched)."""

    @classmethod
    def insert_queue_settings(
        cls,
        operations: Operations,
        table_name: str,
        rows: Sequence[SettingRow],
        *,
        schema: str | None = None,
    ) -> None:
        """Insert ``rows`` (dicts of setting_name, value, unit, casted_as, note)."""
        operations.invoke(cls(table_name, rows, schema=schema))

    def reverse(self) -> DeleteQueueSettingsOp:
        return DeleteQueueSettingsOp(self.table_name, self.rows, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        names = tuple(row["setting_name"] for row in self.rows)
        return ("add_queue_settings", self.schema, self.table_name, names)


@Operations.register_operation("delete_queue_settings")
class DeleteQueueSettingsOp(_SettingsOp):
    """Delete settings from a PEQ configuration table by name."""

    @classmethod
    def delete_queue_settings(
        cls,
        operations: Operations,
        table_name: str,
        setting_names: Sequence[str],
        *,
        schema: str | None = None,
    ) -> None:
        """Delete the rows whose setting_name is in ``setting_names``."""
        rows = [{"setting_name": name} for name in setting_names]
        operations.invoke(cls(table_name, rows, schema=schema))

    def reverse(self) -> InsertQueueSettingsOp:
        return InsertQueueSettingsOp(self.table_name, self.rows, schema=self.schema)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        names = tuple(row["setting_name"] for row in self.rows)
        return ("remove_queue_settings", self.schema, self.table_name, names)


@Operations.implementation_for(InsertQueueSettingsOp)
def _insert_settings(operations: Operations, op: InsertQueueSettingsOp) -> None:
    scoped = any("queue_name" in row for row in op.rows)
    operations.bulk_insert(_settings_table(op.table_name, op.schema, scoped), op.rows)


@Operations.implementation_for(DeleteQueueSettingsOp)
def _delete_settings(operations: Operations, op: DeleteQueueSettingsOp) -> None:
    scoped = [row for row in op.rows if "queue_name" in row]
    settings = _settings_table(op.table_name, op.schema, bool(scoped))
    names = [row["setting_name"] for row in op.rows if "queue_name" not in row]
    if names:
        operations.execute(settings.delete().where(settings.c.setting_name.in_(names)))
    for row in scoped:
        operations.execute(
            settings.delete().where(
                settings.c.setting_name == row["setting_name"],
                settings.c.queue_name == row["queue_name"],
            )
        )


@renderers.dispatch_for(InsertQueueSettingsOp)
def _render_insert_settings(autogen_context: AutogenContext, op: InsertQueueSettingsOp) -> str:
    rows = "".join(f"\n        {row!r}," for row in op.rows)
    call = _call(autogen_context, "insert_queue_settings", op.table_name, [], schema=op.schema)
    # one row a line: the rows are what a reviewer reads
    return call.replace("[]", f"[{rows}\n    ]", 1)


@renderers.dispatch_for(DeleteQueueSettingsOp)
def _render_delete_settings(autogen_context: AutogenContext, op: DeleteQueueSettingsOp) -> str:
    names = [row["setting_name"] for row in op.rows]
    return _call(autogen_context, "delete_queue_settings", op.table_name, names, schema=op.schema)
