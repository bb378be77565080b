"""The statements of unique tasks (``sqla_queue/unique.py``), beside the
adapters: the key table's upsert per dialect, and the reads that must be
locking reads on the MySQL family."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Table, select, update

from ..exceptions import UnsupportedOperationError
from ..mixins import Status, status_is

__all__ = ["UniqueQueries"]

_MYSQL_FAMILY = ("mysql", "mariadb", "singlestoredb")


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
        """(id, status) of the newest attempt of the chain that starts at
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
            query = select(c.id, c.status).where(where, c.dead.is_not(True))
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
