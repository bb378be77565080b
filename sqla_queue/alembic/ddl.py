"""The DDL of a queue as SQL text: what ``sqla-queue ddl`` prints.

Nothing here is written by hand: the tables come from the mixins
(``QueueMixin``, ``SubscriberMixin``, ``ConfigurationMixin``) on a throwaway
``MetaData``, and the statements are the ones ``create_all()`` would send,
caught by a mock engine of the chosen dialect (indexes made only on some
dialects, and the PostgreSQL NOTIFY trigger, included). So this text, a
``create_all()`` and an alembic migration make the same schema. Each
statement ends with ``;`` and the whole runs as is with ``psql -f``,
``mysql <`` and ``sqlite3``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from sqlalchemy import MetaData, Table, create_mock_engine, insert
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.schema import CreateIndex

from ..common.dialects import DIALECTS
from ..common.exceptions import ConfigurationError
from ..common.identifiers import validate_identifier
from ..config.settings import driver_error
from ..schema.configuration_table import (
    CONFIGURATION_TABLE_NAME,
    ConfigurationMixin,
    configuration_rows,
)
from ..schema.mixins import QueueMixin, workflow_tables
from ..schema.subscribers import SubscriberMixin

__all__ = ["DIALECTS", "queue_ddl", "queue_tables"]

SUBSCRIBER_SUFFIX = "_subscriber"  # the reference's subscriber table: <queue>_subscriber


def queue_tables(
    schema: str | None,
    queue: str,
    *,
    subscribers: bool = False,
    config_table: bool = False,
    unique: bool = False,
    unique_processes: Sequence[str] = (),
    metadata: MetaData | None = None,
) -> list[Table]:
    """The tables of queue ``schema.queue``, made by the mixins on ``metadata``
    (a new one by default): the queue table (channel: the queue's name),
    ``<queue>_status``, ``<queue>_wf_steps``, ``_wf_edges``, ``_wf_gates``, then
    ``<queue>_subscriber``, ``queue_configuration`` and ``<queue>_unique``
    when asked for. ``unique_processes``: the
    processes the model declares unique (``Unique(name)``), whose live-key
    index the queue table's creation makes too (``<queue>_unique`` with it)."""
    validate_identifier(queue, "queue name")
    if schema is not None:
        validate_identifier(schema, "schema name")
    if subscribers:
        validate_identifier(queue + SUBSCRIBER_SUFFIX, "subscriber table name")

    class Base(DeclarativeBase):
        pass

    if metadata is not None:
        Base.metadata = metadata

    def model(mixin: type, name: str, class_name: str, **extra: Any) -> Table:
        attributes: dict[str, Any] = {"__tablename__": name, "__table_args__": {"schema": schema}}
        attributes.update(extra)
        return type(class_name, (mixin, Base), attributes).__table__  # type: ignore[attr-defined, no-any-return]

    declared: dict[str, Any] = {}
    if unique_processes:
        from ..enqueue.unique import Unique

        declared["__queue_unique__"] = tuple(Unique(name) for name in unique_processes)
        unique = True
    tables = [model(QueueMixin, queue, "Task", **declared)]
    # status's kept counts (status_summary.py), made by create_all() with it
    from ..ops.status_counts import status_table

    tables.append(status_table(tables[0]))
    # the workflows' steps and edges (docs/workflows.md), made with it too
    workflows = workflow_tables(tables[0])
    tables += [workflows.steps, workflows.edges, workflows.gates]
    if unique:
        from ..enqueue.unique import unique_table

        tables.append(unique_table(tables[0]))
    if subscribers:
        tables.append(model(SubscriberMixin, queue + SUBSCRIBER_SUFFIX, "Subscriber"))
    if config_table:
        # its rows name this queue: another queue of the schema reading the
        # table is not re-tuned by them
        tables.append(
            model(
                ConfigurationMixin,
                CONFIGURATION_TABLE_NAME,
                "QueueConfiguration",
                __configuration_queue__=queue,
            )
        )
    return tables


def queue_ddl(
    schema: str,
    queue: str,
    *,
    dialect: str = "postgresql",
    subscribers: bool = False,
    config_table: bool = False,
    unique: bool = False,
    unique_processes: Sequence[str] = (),
) -> str:
    """The SQL script that creates queue ``schema.queue`` on ``dialect``;
    with ``unique_processes``, the live-key index of those unique processes
    and ``<queue>_unique`` (docs/unique.md).

    On SQLite the only schema is ``main``, and the names are left unqualified."""
    if dialect not in DIALECTS:
        raise ConfigurationError(f"invalid dialect {dialect!r}: use one of {', '.join(DIALECTS)}")
    validate_identifier(schema, "schema name")
    for name in unique_processes:
        if not name.isprintable():
            raise ConfigurationError(f"invalid unique process name {name!r}")
    if dialect == "sqlite" and schema != "main":
        raise ConfigurationError(
            f"invalid schema name {schema!r} for SQLite: a SQLite database has one schema, main"
        )
    tables = queue_tables(
        None if dialect == "sqlite" else schema,
        queue,
        subscribers=subscribers,
        config_table=config_table,
        unique=unique,
        unique_processes=unique_processes,
    )
    elements: list[Any] = []
    url = make_url(DIALECTS[dialect])
    try:
        # "named": a % in a literal is printed as one (a format paramstyle
        # doubles it for the driver, which undoes it; psql and mysql do not)
        engine = create_mock_engine(
            url, lambda sql, *args, **kw: elements.append(sql), paramstyle="named"
        )
    except NoSuchModuleError as exc:  # singlestoredb:// without sqlalchemy-singlestoredb
        raise (driver_error(url, exc) or exc) from None
    statements: list[str] = []
    for table in tables:
        elements.clear()
        table.create(engine, checkfirst=False)
        rows = configuration_rows(table)
        if rows:
            elements.append(insert(table).values(list(rows)))
        statements += [_sql(element, engine.dialect) for element in _in_order(elements)]
    command = f"sqla-queue ddl {schema} {queue} --dialect {dialect}"
    command += " --subscribers" * subscribers + " --config-table" * config_table
    command += " --unique" * (unique and not unique_processes)
    command += "".join(f" --unique-process {shlex.quote(name)}" for name in unique_processes)
    return "\n\n".join([f"-- {command}", *statements]) + "\n"


def _in_order(elements: list[Any]) -> list[Any]:
    """The table, its indexes by name (a table keeps them in a set: the same
    output every run), then the rest as create() sent it."""
    indexes = [e for e in elements if isinstance(e, CreateIndex)]
    indexes.sort(key=lambda e: str(e.element.name))
    others = [e for e in elements if not isinstance(e, CreateIndex)]
    return others[:1] + indexes + others[1:]


def _sql(element: Any, dialect: Dialect) -> str:
    text = str(element.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    return text.strip() + ";"
