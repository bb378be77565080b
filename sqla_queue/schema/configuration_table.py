"""The PEQ configuration table: one row per setting, edited with plain SQL.

PEQ (Postgres Enterprise Queue) keeps a queue's tunable settings in
``{schema}.queue_configuration`` with the columns ``setting_name`` (the key),
``value``, ``unit``, ``casted_as``, ``note`` and ``modified_on``
(``shared/seeds/peq-CONFIG.md``)::

    class QueueConfiguration(ConfigurationMixin, Base):
        __tablename__ = "queue_configuration"

Creating it: the mixin, ``configuration_table(metadata)``, ``sqla-queue ddl
--config-table`` or the alembic operation ``insert_queue_settings``. The
rows a new table starts with (``__configuration_rows__``, PEQ's documented
defaults unless the model says otherwise) are written once, never updated
afterwards: the values belong to the operators.

Which queue a row applies to: its ``queue_name`` (sqla-queue's column,
beside PEQ's), the name of a queue table, or ``*`` for every queue that
reads the table. ``sqla-queue ddl --config-table`` writes rows naming the
queue it makes; a model's ``__configuration_queue__`` names the queue of
the rows it starts with (``*`` when unset). A table without the column
(PEQ's own, or one made before it) is schema-wide: each row applies to
every queue reading it, and ``config show`` says so.

Reading it: workers read the table named ``queue_configuration`` in the
queue table's schema, or the name the model gives as
``__queue_configuration__``, at start: the rows naming their queue table,
over the ``*`` rows.
A row's ``unit`` converts its value (``2`` ``hours`` for a setting in
seconds is 7200); ``casted_as`` and ``note`` are for people. The settings it
may hold, and their precedence, are in ``catalog.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict
from weakref import WeakKeyDictionary

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    event,
    inspect,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapped, Mapper, mapped_column

from ..common.identifiers import split_table_name, validate_identifier
from ..common.types import UtcDateTime, utc_now
from ..config.sources import SCHEMA_WIDE
from .mixins import QueueMixin

__all__ = [
    "CONFIGURATION_TABLE",
    "CONFIGURATION_TABLE_NAME",
    "PEQ_SETTINGS",
    "ConfigurationMixin",
    "SettingRow",
    "configuration_rows",
    "configuration_table",
    "configuration_table_for",
    "configuration_table_of",
    "has_queue_name",
]

#: ``queue_name``'s length: a table name (PostgreSQL's limit; MySQL's is 64)
QUEUE_NAME_LENGTH = 63
CONFIGURATION_TABLE_NAME = "queue_configuration"
"""PEQ's name for the table (one per schema, as PEQ has one schema per queue)."""
CONFIGURATION_TABLE = CONFIGURATION_TABLE_NAME


class _SettingColumns(TypedDict):
    setting_name: str
    value: str
    unit: str
    casted_as: str
    note: str


class SettingRow(_SettingColumns, total=False):
    """One row of the configuration table, as written when the table is new
    (``queue_name``: the queue it applies to; ``*`` when absent)."""

    queue_name: str


def _setting(name: str, value: str, unit: str, casted_as: str, note: str) -> SettingRow:
    return SettingRow(setting_name=name, value=value, unit=unit, casted_as=casted_as, note=note)


_BACKOFF = "think carefully before changing any of these settings, see the backoff formula"
#: PEQ's documented settings and defaults (peq-CONFIG.md, in its order)
PEQ_SETTINGS: tuple[SettingRow, ...] = (
    _setting(
        "audit_retention",
        "31",
        "days",
        "number",
        "this should be adjusted for your org's data retention policy",
    ),
    _setting("backoff_base", "10", "seconds", "number", _BACKOFF),
    _setting("backoff_factor", "2", "number", "number", _BACKOFF),
    _setting("backoff_jitter_max", "99", "number", "number", _BACKOFF),
    _setting("backoff_jitter_min", "11", "number", "number", _BACKOFF),
    _setting(
        "cron_schedule_retention_audit_log",
        "0 3 * * *",
        "cron",
        "string",
        "schedule of the audit log cleanup, 3am daily",
    ),
    _setting(
        "cron_schedule_retention_dead_letter",
        "0 3 * * *",
        "cron",
        "string",
        "schedule of the dead-letter cleanup, 3am daily",
    ),
    _setting(
        "cron_schedule_retention_history",
        "8 1 * * 6",
        "cron",
        "string",
        "schedule of the history cleanup, 1:08am Saturday",
    ),
    _setting(
        "cron_schedule_retention_queue",
        "*/7 * * * *",
        "cron",
        "string",
        "schedule of the queue's lock clearing, every 7 minutes",
    ),
    _setting("cron_vacuum", "45 4 * * *", "cron", "string", "vacuum nightly"),
    _setting(
        "dead_letter_retention",
        "91",
        "days",
        "number",
        "dead letters are purged after this many days (they can be requeued until then)",
    ),
    _setting(
        "history_retention",
        "181",
        "days",
        "number",
        "this should be adjusted for your org's data retention policy",
    ),
    _setting(
        "item_delay",
        "0",
        "seconds",
        "number",
        "a new task becomes available after this many seconds",
    ),
    _setting(
        "item_ttl",
        "4320",
        "minutes",
        "number",
        "a task pending longer than this goes to the dead letter",
    ),
    _setting(
        "lease_duration",
        "30",
        "seconds",
        "number",
        "the lease of a claimed task, unless the call gives one: the average run time "
        "plus two standard deviations, rounded up",
    ),
    _setting(
        "max_retries",
        "7",
        "count",
        "number",
        "a task runs at most this many times (exponential backoff with jitter)",
    ),
)


class ConfigurationMixin:
    """Columns of a PEQ configuration table (one row per setting)."""

    #: the rows a new table starts with (ddl and alembic write them once)
    __configuration_rows__: ClassVar[Sequence[SettingRow]] = PEQ_SETTINGS
    #: the queue table those rows apply to (``*``: every queue reading the table)
    __configuration_queue__: ClassVar[str] = SCHEMA_WIDE
    if TYPE_CHECKING:
        __table__: ClassVar[Table]

    setting_name: Mapped[str] = mapped_column("setting_name", String(100), primary_key=True)
    queue_name: Mapped[str] = mapped_column(
        "queue_name",
        String(QUEUE_NAME_LENGTH),
        primary_key=True,
        server_default=SCHEMA_WIDE,
        default=SCHEMA_WIDE,
    )
    value: Mapped[str | None] = mapped_column("value", String(500))
    unit: Mapped[str | None] = mapped_column("unit", String(20))
    casted_as: Mapped[str] = mapped_column(
        "casted_as", String(20), nullable=False, server_default="INTEGER"
    )
    note: Mapped[str | None] = mapped_column("note", Text)
    # PEQ keeps it with a trigger; here the database sets it on insert and
    # SQLAlchemy on every ORM or Core update (a hand-written UPDATE sets it itself)
    modified_on: Mapped[dt.datetime] = mapped_column(
        "modified_on", UtcDateTime, nullable=False, server_default=utc_now(), onupdate=utc_now()
    )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.setting_name}={self.value!r} {self.unit or ''}>"


_ROWS: WeakKeyDictionary[Table, tuple[SettingRow, ...]] = WeakKeyDictionary()


@event.listens_for(ConfigurationMixin, "after_mapper_constructed", propagate=True)
def _mark_configuration_table(mapper: Mapper[Any], cls: type[ConfigurationMixin]) -> None:
    table = mapper.local_table
    if not isinstance(table, Table) or mapper.inherits is not None:
        return
    validate_identifier(table.name, "table name")
    if table.schema is not None:
        validate_identifier(table.schema, "schema name")
    queue = cls.__configuration_queue__
    if queue != SCHEMA_WIDE:
        validate_identifier(queue, "__configuration_queue__")
    # kept beside the table, not in Table.info: autogenerate writes a table's
    # info into its create_table(), and the rows are written once already
    _ROWS[table] = tuple(
        SettingRow(**{**row, "queue_name": row.get("queue_name", queue)})  # type: ignore[typeddict-item]
        for row in cls.__configuration_rows__
    )


def configuration_rows(table: Table) -> tuple[SettingRow, ...] | None:
    """The rows a new configuration table starts with; None when ``table`` is
    not a ``ConfigurationMixin`` model's table."""
    return _ROWS.get(table)


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
        Column(
            "queue_name", String(QUEUE_NAME_LENGTH), primary_key=True, server_default=SCHEMA_WIDE
        ),
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


def configuration_table_for(queue: Table) -> Table:
    """The configuration table of queue table ``queue``, where the queue is
    known by its Table alone (an adapter's): its model's
    (:func:`configuration_table_of`), the mapped ``QueueMixin`` class whose
    table it is, or else the schema's ``queue_configuration``."""
    pending: list[type] = [QueueMixin]
    while pending:
        cls = pending.pop()
        if cls.__dict__.get("__table__") is queue:
            return configuration_table_of(cls)
        pending.extend(cls.__subclasses__())
    return configuration_table(MetaData(), CONFIGURATION_TABLE, schema=queue.schema)


def ensure_table(engine: Engine, table: Table) -> None:
    """Create the configuration table unless it exists. Workers starting
    together may each try: PostgreSQL fails one concurrent CREATE with a
    duplicate key in its catalogue, MariaDB with "already exists"; the table
    being there afterwards is what counts."""
    try:
        table.create(engine, checkfirst=True)
    except SQLAlchemyError:
        if not inspect(engine).has_table(table.name, schema=table.schema):
            raise


def has_queue_name(conn: Connection, table: Table) -> bool:
    """Whether the configuration table in the database has ``queue_name``
    (else its rows are schema-wide: PEQ's own, or one made before it)."""
    columns = inspect(conn).get_columns(table.name, schema=table.schema)
    return any(column["name"] == "queue_name" for column in columns)
