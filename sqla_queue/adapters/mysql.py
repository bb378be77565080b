"""MySQL and MariaDB: SKIP LOCKED claims and GET_LOCK per task.

There is no UPDATE ... RETURNING, so a claim is a short transaction on the
claim connection: select ready rows ``FOR UPDATE SKIP LOCKED`` (MariaDB 10.6+,
MySQL 8.0+), take a ``GET_LOCK`` per task (session-level: it dies with the
connection, like a PostgreSQL advisory lock), mark them ``processando``,
commit. Wake-ups are by polling: MySQL has no LISTEN/NOTIFY.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Integer, bindparam, func, select, text, update
from sqlalchemy.sql.elements import ColumnElement

from ..mixins import Status
from ..records import TaskRecord
from .base import Adapter

PROMOTE_CHUNK = 1000


class MySQLAdapter(Adapter):
    family = "mysql"
    claim_autocommit = False
    supports_task_locks = True

    def __init__(self, table: Any, channel: str) -> None:
        super().__init__(table, channel)
        c = self.table.c
        self._select_ready = (
            select(self.table)
            .where(c.status == Status.PENDING.value, c.data_hora <= self.now())
            .order_by(*self._claim_order)
            .limit(self._limit_param())
            .with_for_update(skip_locked=True)
        )
        self._mark_processing = (
            update(self.table).where(self._id_in("ids")).values(status=Status.PROCESSING.value)
        )
        self._processing = (
            select(c.id)
            .where(c.status == Status.PROCESSING.value)
            .order_by(c.id)
            .limit(self._limit_param())
        )
        self._rows_by_id = select(self.table).where(self._id_in("ids"))
        self._still_processing = select(self.table).where(
            self._id_in("ids"), c.status == Status.PROCESSING.value
        )
        # promotion in two steps: a plain read (no locks) finds the due rows,
        # then an UPDATE by primary key. A single UPDATE ... WHERE status
        # scans the status index under locks and deadlocks with the claim's
        # UPDATE, whose index entries it touches.
        self._due_ids = (
            select(c.id)
            .where(c.status == Status.SCHEDULED.value, c.data_hora <= self.now())
            .order_by(c.data_hora, c.id)
            .limit(self._limit_param())
        )
        self._promote_ids = (
            update(self.table)
            .where(self._id_in("ids"), c.status == Status.SCHEDULED.value)
            .values(status=Status.PENDING.value)
        )
        # lock names are at most 64 characters: hash the table name
        self._lock_prefix = f"sqlaq:{zlib.crc32(self.qualified_name.encode()):08x}:"

    def _limit_param(self) -> Any:
        return bindparam("limit", type_=Integer, literal_execute=True)

    def connect_claim(self, engine: Engine) -> Connection:
        # READ COMMITTED: the locking read takes no gap locks, so enqueuers
        # never wait for a claim
        return engine.connect().execution_options(isolation_level="READ COMMITTED")

    def now(self) -> ColumnElement[dt.datetime]:
        return func.utc_timestamp(6)

    def is_transient(self, exc: BaseException) -> bool:
        # 1213 deadlock, 1205 lock wait timeout: InnoDB rolled the statement
        # or the transaction back, and the same work can be tried again
        orig = getattr(exc, "orig", exc)
        args: tuple[Any, ...] = getattr(orig, "args", ())
        return bool(args) and args[0] in (1205, 1213)

    def task_promote_due(self, conn: Connection) -> int:
        ids = conn.execute(self._due_ids, {"limit": PROMOTE_CHUNK}).scalars().all()
        if not ids:
            return 0
        return conn.execute(self._promote_ids, {"ids": list(ids)}).rowcount

    def _lock_name(self, task_id: int) -> str:
        return f"{self._lock_prefix}{task_id}"

    def _get_locks(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Take the lock of each id without waiting; the ids obtained."""
        names = {f"n{i}": self._lock_name(task_id) for i, task_id in enumerate(ids)}
        sql = "SELECT " + ", ".join(f"GET_LOCK(:{key}, 0)" for key in names)
        got = conn.execute(text(sql), names).one()
        return [task_id for task_id, ok in zip(ids, got, strict=True) if ok == 1]

    def task_claim_many(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        result = conn.execute(self._select_ready, {"limit": limit})
        keys = list(result.keys())
        rows = result.all()
        if not rows:
            return []
        locked = self._get_locks(conn, [row.id for row in rows])
        try:
            ours = set(locked)
            rows = [row for row in rows if row.id in ours]
            if rows:
                conn.execute(self._mark_processing, {"ids": [row.id for row in rows]})
            return self._records(keys, rows, conn)
        except BaseException:
            # GET_LOCK is not transactional: give back what this failed claim took
            self.lock_release_many(conn, ids=locked)
            raise

    def lock_release_many(self, conn: Connection, *, ids: Sequence[int]) -> None:
        if not ids:
            return
        names = {f"n{i}": self._lock_name(task_id) for i, task_id in enumerate(ids)}
        sql = "SELECT " + ", ".join(f"RELEASE_LOCK(:{key})" for key in names)
        conn.execute(text(sql), names)

    def task_rescue_lost(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        ids = conn.execute(self._processing, {"limit": limit}).scalars().all()
        if not ids:
            return []
        ours = self._get_locks(conn, list(ids))
        if not ours:
            return []
        # read again under the locks: a task that finished between the first
        # read and the lock is not lost, and must not run twice
        lost = self._fetch_records(conn, self._still_processing, {"ids": ours})
        finished = set(ours) - {task.id for task in lost}
        self.lock_release_many(conn, ids=sorted(finished))
        return lost

    def lock_try(self, conn: Connection, *, key: int) -> bool:
        name = f"{self._lock_prefix}m{key}"
        return conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name}).scalar() == 1

    def lock_release(self, conn: Connection, *, key: int) -> None:
        name = f"{self._lock_prefix}m{key}"
        conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
