"""The PEQ configuration table: one row per setting, edited with plain SQL.

PEQ (Postgres Enterprise Queue) keeps a queue's tunable settings in
``{schema}.queue_configuration`` with the columns ``setting_name`` (the key),
``value``, ``unit``, ``casted_as``, ``note`` and ``modified_on``
(``shared/seeds/peq-CONFIG.md``)::

    class QueueConfiguration(ConfigurationMixin, Base):
        __tablename__ = "queue_configuration"

This module is the table only: the rows a new table starts with
(``__configuration_rows__``, PEQ's documented defaults unless the model says
otherwise) are written by ``sqla-queue ddl --config-table`` and by the
alembic operation ``insert_queue_settings``, never updated afterwards (the
values belong to the operators). How workers read them is the settings
module's business.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict
from weakref import WeakKeyDictionary

from sqlalchemy import String, Table, Text, event
from sqlalchemy.orm import Mapped, Mapper, mapped_column

from .identifiers import validate_identifier
from .types import UtcDateTime, utc_now

__all__ = [
    "CONFIGURATION_TABLE_NAME",
    "PEQ_SETTINGS",
    "ConfigurationMixin",
    "SettingRow",
    "configuration_rows",
]

CONFIGURATION_TABLE_NAME = "queue_configuration"
"""PEQ's name for the table (one per schema, as PEQ has one schema per queue)."""


class SettingRow(TypedDict):
    """One row of the configuration table, as written when the table is new."""

    setting_name: str
    value: str
    unit: str
    casted_as: str
    note: str


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
    if TYPE_CHECKING:
        __table__: ClassVar[Table]

    setting_name: Mapped[str] = mapped_column("setting_name", String(100), primary_key=True)
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
    # kept beside the table, not in Table.info: autogenerate writes a table's
    # info into its create_table(), and the rows are written once already
    _ROWS[table] = tuple(cls.__configuration_rows__)


def configuration_rows(table: Table) -> tuple[SettingRow, ...] | None:
    """The rows a new configuration table starts with; None when ``table`` is
    not a ``ConfigurationMixin`` model's table."""
    return _ROWS.get(table)
