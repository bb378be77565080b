"""The statements of unique tasks (``sqla_queue/enqueue/unique.py``), beside the
adapters: the key table's upsert per dialect, the reads that must be
locking reads on the MySQL family, and the live-key index per dialect (the
database's own guard: at most one live task per key), with the error its
violation becomes."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Index,
    MetaData,
    String,
    Table,
    and_,
    false,
    select,
    update,
)
from sqlalchemy.engine import Dialect, ExceptionContext
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import DDL, CreateIndex, ExecutableDDLElement
from sqlalchemy.sql.elements import ColumnElement

from ..common.exceptions import DuplicateTaskError, UnsupportedOperationError
from ..common.identifiers import derived_identifier
from ..common.types import dialect_family
from ..schema.mixins import OPEN_STATUSES, Status, status_is

__all__ = [
    "LIVE_KEY_COLUMN",
    "UniqueQueries",
    "duplicate_error",
    "live_condition",
    "live_index_name",
    "live_index_names",
    "live_key_create",
    "live_key_drop_statements",
    "live_key_statements",
    "refused_by_live_index",
]

_MYSQL_FAMILY = ("mysql", "mariadb", "singlestoredb")

# ------------------------------------------------------------ the live key
#: the live-key index: ``ix_<table>_unica``
LIVE_INDEX_SUFFIX = "unica"
#: the MySQL family's generated column, the key while the task is live and
#: NULL otherwise (``sqlaq_``: never read as a user's column, records.py)
LIVE_KEY_COLUMN = "sqlaq_unique_key"


def live_index_name(table_name: str) -> str:
    """The live-key index (PostgreSQL, SQLite: of the rows without a tenant)."""
    return derived_identifier(table_name, LIVE_INDEX_SUFFIX, "ix_")


def live_index_names(table_name: str) -> tuple[str, str]:
    """Both live-key indexes of PostgreSQL and SQLite: without a tenant,
    with one (the MySQL family has the first only)."""
    return live_index_name(table_name), derived_identifier(
        table_name, f"tenant_{LIVE_INDEX_SUFFIX}", "ix_"
    )


def live_condition(c: Any, processes: Sequence[str]) -> ColumnElement[bool]:
    """The rows that hold their key: a task of a unique process (one of
    ``processes``) with an external key, waiting or running (its retries
    included: a retry is the chain's one open row), neither a dead-letter
    run nor a pub/sub copy. The one definition of "live" that the index
    predicate (PostgreSQL, SQLite) and the generated column (MySQL family)
    are written from; the statuses are ``OPEN_STATUSES``, which the flush
    hook's check (unique.py) counts too, inline (an index predicate takes no
    bound parameter)."""
    return and_(
        c.processo.in_(sorted(processes)),
        c.chave_externa.is_not(None),
        status_is(c.status, *OPEN_STATUSES),
        c.dead == false(),
        c.subscriber_id.is_(None),
    )


def _shadow(table: Table) -> Table:
    """The columns the live key reads, on a throwaway Table of the same
    name (an index built here never joins the model's metadata)."""
    return Table(
        table.name,
        MetaData(),
        Column("processo", String(250)),
        Column("chave_externa", String(100)),
        Column("tenant", BigInteger),
        Column("status", String(100)),
        Column("dead", Boolean),
        Column("subscriber_id", String(100)),
        schema=table.schema,
    )


def _partial(name: str, columns: list[Any], where: ColumnElement[bool]) -> Index:
    return Index(name, *columns, unique=True, postgresql_where=where, sqlite_where=where)


def _mysql_live_condition(processes: Sequence[str]) -> str:
    """:func:`live_condition` in MySQL's words: the process names compared
    as bytes (hex literals: no collation folds 'X' into 'x', no quoting)."""
    names = ", ".join(f"X'{name.encode('utf-8').hex()}'" for name in sorted(processes))
    statuses = ", ".join(f"'{status}'" for status in OPEN_STATUSES)
    return (
        f"CAST(processo AS BINARY) IN ({names}) AND chave_externa IS NOT NULL "
        f"AND status IN ({statuses}) AND dead = 0 AND subscriber_id IS NULL"
    )


def live_key_statements(
    table: Table, processes: Sequence[str], dialect: Dialect
) -> list[ExecutableDDLElement]:
    """The DDL that makes the live-key index of ``table`` on ``dialect``
    (elements, compiled by the connection that runs them, so that a literal
    is written as its driver wants it):

    - PostgreSQL, SQLite: two partial unique indexes WHERE
      :func:`live_condition`: on (process, external key) of the rows
      without a tenant, and on (process, external key, tenant) of the rows
      with one (so that a NULL tenant is one value, as the key table's hash
      has it, with plain columns that every version of both can index and
      SQLAlchemy can reflect);
    - MariaDB/MySQL: no partial index; a stored generated column,
      :data:`LIVE_KEY_COLUMN`, the SHA-256 of the process, tenant and key
      while the row is live and NULL otherwise, and a plain UNIQUE index on
      it (NULLs never collide);
    - SingleStore: nothing. Its unique keys must contain the shard key
      (``id``, ddl_singlestore.py), so it cannot refuse a second live task;
      the flush hook's check is all there is.

    Nothing when ``processes`` is empty."""
    if not processes:
        return []
    family = dialect_family(dialect)
    name = live_index_name(table.name)
    if family in ("postgresql", "sqlite"):
        c = _shadow(table).c
        live = live_condition(c, processes)
        without, with_tenant = live_index_names(table.name)
        indexes = [
            _partial(without, [c.processo, c.chave_externa], and_(live, c.tenant.is_(None))),
            _partial(
                with_tenant,
                [c.processo, c.chave_externa, c.tenant],
                and_(live, c.tenant.is_not(None)),
            ),
        ]
        return [CreateIndex(index) for index in indexes]
    if family == "mysql":
        quote = dialect.identifier_preparer.quote
        owner = f"{quote(table.schema)}." if table.schema else ""
        qualified = f"{owner}{quote(table.name)}"
        key = (
            "SHA2(CONCAT(CHAR_LENGTH(processo), ':', processo, ':', "
            "IFNULL(tenant, 'n'), ':', chave_externa), 256)"
        )
        # one statement: a duplicate found on the way leaves no column behind
        return [
            DDL(  # type: ignore[no-untyped-call]
                f"ALTER TABLE {qualified} ADD COLUMN {quote(LIVE_KEY_COLUMN)} "
                "CHAR(64) CHARACTER SET ascii COLLATE ascii_bin GENERATED ALWAYS AS "
                f"(CASE WHEN {_mysql_live_condition(processes)} THEN {key} END) STORED, "
                f"ADD UNIQUE INDEX {quote(name)} ({quote(LIVE_KEY_COLUMN)})"
            )
        ]
    return []


def live_key_create(connection: Any, table: Table, processes: Sequence[str]) -> None:
    """Run :func:`live_key_statements` on ``connection`` (``create_all()``'s
    ``after_create`` of the queue table: unique.py)."""
    for statement in live_key_statements(table, processes, connection.dialect):
        connection.execute(statement)


def live_key_drop_statements(table: Table, dialect: Dialect) -> list[str]:
    """The DDL that drops what :func:`live_key_statements` made."""
    family = dialect_family(dialect)
    quote = dialect.identifier_preparer.quote
    owner = f"{quote(table.schema)}." if table.schema else ""
    name = live_index_name(table.name)
    if family in ("postgresql", "sqlite"):
        return [
            f"DROP INDEX IF EXISTS {owner}{quote(index)}" for index in live_index_names(table.name)
        ]
    if family == "mysql":
        qualified = f"{owner}{quote(table.name)}"
        return [
            f"ALTER TABLE {qualified} DROP INDEX {quote(name)}, "
            f"DROP COLUMN {quote(LIVE_KEY_COLUMN)}"
        ]
    return []


#: the index's name in the database's error: PostgreSQL's "violates unique
#: constraint \"ix_..._unica\"", MariaDB's "for key 'ix_..._unica'" (MySQL
#: 8: 'table.ix_..._unica')
_REFUSED = re.compile(r"\b(ix_\w*_" + LIVE_INDEX_SUFFIX + r")\b")
#: SQLite names the columns of an index on columns, not the index
_SQLITE_REFUSED = re.compile(
    r"UNIQUE constraint failed: (\w+)\.processo, \1\.chave_externa(, \1\.tenant)?$"
)


def duplicate_error(exc: BaseException | None) -> DuplicateTaskError | None:
    """The error a violation of a live-key index becomes: one line, in the
    words of the flush hook's; None for any other error."""
    if not isinstance(exc, IntegrityError):
        return None
    message = str(exc.orig).strip()
    found = _REFUSED.search(message)
    if found is not None:
        index = found.group(1)
    else:
        columns = _SQLITE_REFUSED.search(message)
        if columns is None:
            return None
        index = live_index_names(columns.group(1))[1 if columns.group(2) else 0]
    return DuplicateTaskError(
        "a live task of this unique process already has this external key and tenant "
        f"(refused by the unique index {index}): roll the transaction back"
    )


def refused_by_live_index(context: ExceptionContext) -> None:
    """The ``handle_error`` listener (every engine; unique.py registers it):
    a live-key index's violation raised as :func:`duplicate_error`."""
    error = duplicate_error(context.sqlalchemy_exception)
    if error is not None:
        raise error


class UniqueQueries:
    """``table``: the queue table; ``keys``: its ``<table>_unique``."""

    def __init__(self, table: Table, keys: Table) -> None:
        self.table = table
        self.keys = keys

    def reserve(self, conn: Connection, key: str, now: dt.datetime) -> None:
        """Insert the key's row unless it exists, without an error either
        way: ``INSERT ... ON CONFLICT DO NOTHING`` (PostgreSQL, SQLite) or
        ``ON DUPLICATE KEY UPDATE`` (MySQL family), which waits for a
        concurrent transaction that inserted the same key. No savepoint and
        no caught error: pysqlite commits a transaction whose first
        statement was a SAVEPOINT when it is released, and after a
        duplicate-key error InnoDB keeps a shared lock that two enqueues
        then both ask to raise, and deadlock; the upsert takes the
        exclusive lock at once."""
        values = {"unique_key": key, "task_id": None, "taken_at": now}
        name = conn.dialect.name
        if name in _MYSQL_FAMILY:
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            upsert = mysql_insert(self.keys).values(**values)
            conn.execute(upsert.on_duplicate_key_update(unique_key=upsert.inserted.unique_key))
        elif name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            conn.execute(pg_insert(self.keys).values(**values).on_conflict_do_nothing())
        elif name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            conn.execute(sqlite_insert(self.keys).values(**values).on_conflict_do_nothing())
        else:
            raise UnsupportedOperationError(f"unique tasks are not supported on {name}")

    def held(self, conn: Connection, key: str) -> Any:
        """(task_id, taken_at) of the key, locked until the transaction ends."""
        k = self.keys.c
        return conn.execute(
            select(k.task_id, k.taken_at).where(k.unique_key == key).with_for_update()
        ).first()

    def take(self, conn: Connection, key: str, now: dt.datetime) -> None:
        """The key, free, is taken now (its task bound later)."""
        k = self.keys.c
        conn.execute(
            update(self.keys).where(k.unique_key == key).values(task_id=None, taken_at=now)
        )

    def bind(self, conn: Connection, key: str, task_id: int) -> None:
        k = self.keys.c
        conn.execute(update(self.keys).where(k.unique_key == key).values(task_id=task_id))

    def newest_attempt(self, conn: Connection, task_id: int) -> Any:
        """(id, status, processo, tenant, chave_externa) of the newest
        attempt of the chain that starts at
        ``task_id`` (its retries, not its dead-letter runs): the first
        attempt by the primary key, the retries by ``ix_<table>_inicial``.
        With a shared lock on the MySQL family, whose plain reads under
        REPEATABLE READ would not see a chain committed after the
        transaction's first read."""
        c = self.table.c
        locking = conn.dialect.name in _MYSQL_FAMILY
        rows: list[Any] = []
        # no ORDER BY ... LIMIT 1: a planner without statistics may walk
        # the primary key backwards for it; a chain has a few rows
        for where in (c.id == task_id, c.id_inicial == task_id):
            query = select(c.id, c.status, c.processo, c.tenant, c.chave_externa).where(
                where, c.dead.is_not(True)
            )
            rows += conn.execute(query.with_for_update(read=True) if locking else query).all()
        return max(rows, key=lambda row: row.id, default=None)

    def replace_waiting(self, conn: Connection, attempt: int, values: dict[str, Any]) -> bool:
        """Give the waiting attempt ``attempt`` ``values``; False when it
        is no longer waiting (a claim took it meanwhile)."""
        c = self.table.c
        result = conn.execute(
            update(self.table)
            .where(c.id == attempt, status_is(c.status, Status.PENDING, Status.SCHEDULED))
            .values(**values)
        )
        return bool(result.rowcount)
