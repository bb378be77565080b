"""SQLite, the embedded default: one writer at a time, ``BEGIN IMMEDIATE``.

A claim is ``UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING`` inside
``BEGIN IMMEDIATE``: the write lock is taken before the read, so two workers
never claim the same row. Waits for the lock use SQLite's busy timeout; the
worker's engine runs in WAL mode so readers never wait for writers.
SQLite has no lock that dies with a process: a task whose worker was killed
is rescued once its lease expires.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, event, false, select, update

from ..schema.mixins import Status
from ..schema.records import TaskRecord
from .base import Adapter
from .locks import LocalRoutineLock, RoutineLock, SQLiteRoutineLock

BUSY_TIMEOUT_SECONDS = 30.0
# set on a pooled connection's record once it has the settings below
_PREPARED = "sqla_queue_sqlite_prepared"


def _use_wal(cursor: Any) -> None:
    """Put the database file in WAL mode, once, even when processes race.

    Switching the journal mode needs an exclusive lock and SQLite answers
    "database is locked" at once, without the busy handler, when another
    connection holds any lock; so read the mode first (WAL persists in the
    file) and retry the switch until the busy timeout has passed.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    delay = 0.005
    while True:
        try:
            # not execute(...).fetchone(): the async driver's cursor returns no cursor
            cursor.execute("PRAGMA journal_mode")
            mode = cursor.fetchone()[0]
            if str(mode).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)  # back off between attempts, bounded by the deadline
        delay = min(delay * 2, 0.2)


class SQLiteAdapter(Adapter):
    family = "sqlite"
    single_writer = True

    def _prepare(self) -> None:
        super()._prepare()
        c = self.table.c
        ready = (
            select(c.id)
            .where(*self._ready())
            .order_by(*self._claim_order)
            .limit(bindparam("limit"))
        )
        self._claim = (
            update(self.table)
            .where(c.id.in_(ready.scalar_subquery()))
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("owner"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
            .returning(*c)
        )
        self._write_lock = update(self.table).where(false()).values(id=c.id)

    def is_transient(self, exc: BaseException) -> bool:
        # the busy timeout ran out while another process held the write lock
        return "database is locked" in str(getattr(exc, "orig", exc))

    def is_permanent(self, exc: BaseException) -> bool:
        # a missing table: waiting does not make it appear (sqlite3 raises
        # an OperationalError, which would otherwise read as a lost connection)
        return "no such table" in str(getattr(exc, "orig", exc))

    def prepare_engine(self, engine: Engine) -> None:
        if getattr(engine, "_sqla_queue_sqlite", False):
            return
        engine._sqla_queue_sqlite = True  # type: ignore[attr-defined]

        @event.listens_for(engine, "checkout")
        def _checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
            # at checkout, not at connect: the engine may have pooled
            # connections from before this call (the worker reads its
            # queue_configuration first), which would otherwise keep
            # pysqlite's 5-second busy timeout and its own BEGINs
            if record.info.get(_PREPARED):
                return
            # let SQLAlchemy, not pysqlite, decide when transactions begin
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            if engine.url.database not in (None, "", ":memory:"):
                _use_wal(cursor)
            cursor.close()
            record.info[_PREPARED] = True

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # take the write lock up front: a deferred transaction that reads
            # and then writes can fail at once instead of waiting its turn
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def routine_lock(self, engine: Engine) -> RoutineLock:
        database = engine.url.database
        if database in (None, "", ":memory:") or database.startswith("file::memory:"):
            return LocalRoutineLock(f"{id(engine)}:{self.qualified_name}")
        return SQLiteRoutineLock(database, self.qualified_name)

    def lock_writers(self, conn: Connection) -> None:
        # SQLite has no row locks (FOR UPDATE is left out), and Python's
        # sqlite3 begins no transaction before a SELECT: two connections could
        # both read "not done yet" and both write. A write that matches
        # nothing (its constant false condition is tested once, before any
        # row is read) takes the database's write lock (and, as the transaction's
        # first statement, a fresh snapshot) until the transaction ends: the
        # other connection's first write waits for it, then reads what it
        # committed. Inside a transaction that read an older snapshot, SQLite
        # refuses the write ("database is locked") instead.
        conn.execute(self._write_lock)

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        params = {"limit": limit, "owner": owner, **self._lease_params(lease_seconds)}
        return self._fetch_records(conn, self._claim, params)
