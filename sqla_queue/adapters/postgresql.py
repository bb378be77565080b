"""PostgreSQL: SKIP LOCKED claims, advisory locks, LISTEN/NOTIFY.

A claim is one autocommit statement: it marks up to N ready rows
``processando`` (``FOR UPDATE SKIP LOCKED``, so concurrent workers never
take the same row) and, in its RETURNING list, takes a session-level
advisory lock per task on the claim connection. The lock lives exactly as
long as that connection: if the worker dies, the lock goes with it and the
rescue can tell the task is lost. Lock keys are (queue namespace, low 32
bits of the id), so queues and maintenance routines never share keys.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    Table,
    any_,
    bindparam,
    cast,
    event,
    func,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import Select
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement, TextClause

from ..common.exceptions import UnsupportedOperationError
from ..common.redaction import describe_error, escape_controls
from ..schema.mixins import COLUMN_NAMES, Status, inline_count, status_is
from ..schema.records import TaskRecord
from . import libpq
from .base import (
    PROMOTE_CHUNK,
    Adapter,
    DriverErrors,
    HorizonHolder,
    Listener,
    LockHolder,
    TableHealth,
    VacuumState,
    Wake,
    driver_cursor,
    statements_unobserved,
)
from .liveness import Keepalive, on_new_connections, remember
from .locks import SESSION_NAME, DatabaseRoutineLock, LeaseRoutineLock, RoutineLock
from .sqla_private import traversed_clauses

logger = logging.getLogger("sqla_queue.postgresql")
_UNKNOWN: Any = object()
_LENGTH = re.compile(r"\(\d+\)$")  # VARCHAR(250) -> VARCHAR
# what the server answers a login that will never succeed, as libpq words
# it (and PgBouncer, for a database it does not serve: "no such database")
_REFUSED_LOGIN = re.compile(
    r"FATAL:  (database \".*\" does not exist|role \".*\" does not exist"
    r"|password authentication failed|no pg_hba\.conf entry|permission denied for database"
    r"|no such database)"
)

LISTEN_POLL_SECONDS = 1.0  # how often the listener thread checks for stop
RECONNECT_DELAY_SECONDS = 1.0
#: the longest wait between two LISTEN connection attempts while the database is away
LISTEN_RETRY_MAX_SECONDS = 4.0
#: releases the per-task lock of task x, for each x of the ids array :ids
TASK_UNLOCK = "pg_advisory_unlock(:ns, ((x % 4294967296) - 2147483648)::int4)"
OVER_IDS = "FROM unnest(CAST(:ids AS bigint[])) AS x"
#: set on the worker's own connections (claim, heartbeat, routines), with
#: the server version that has the parameter: see PostgresAdapter.own_connection
SESSION_SETTINGS = (
    ("enable_seqscan", "off", (0,)),
    ("jit", "off", (11,)),
    ("plan_cache_mode", "force_generic_plan", (12,)),
    ("idle_session_timeout", "0", (14,)),
)
_SESSION_MARK = "sqla_queue_session"
#: record.info: whether the connection goes through a pooler or proxy
_PROXIED = "sqla_queue_proxied"
#: the claim's plan settings (SESSION_SETTINGS) for its transaction alone,
#: those this server has
_PLAN_SETTINGS_LOCAL = text(
    "SELECT set_config(s.name, v.value, true) FROM (VALUES ('enable_seqscan', 'off'),"
    " ('jit', 'off'), ('plan_cache_mode', 'force_generic_plan')) AS v(name, value)"
    " JOIN pg_settings AS s ON s.name = v.name"
)
#: a lane's work session: never ended for being idle (keep_lane_session);
#: the names set, for the reset at check-in
_LANE_SESSION_SETTINGS = text(
    "SELECT name, set_config(name, '0', false) FROM pg_settings"
    " WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')"
)
#: the LISTEN connection (autocommit, no parameters)
_LISTEN_SESSION_SETTINGS = (
    "SELECT set_config(name, '0', false) FROM pg_settings WHERE name = 'idle_session_timeout'"
)
#: statements kept compiled for the DBAPI cursor, per cache (the claim's:
#: one per LIMIT seen)
DIRECT_KEPT = 256
_T = TypeVar("_T")
#: what the claim's RETURNING list may hold for it to run on the cursor
_CLAIM_KEYS = frozenset({*COLUMN_NAMES.values(), "sqlaq_locked"})


def _lock_objid(id_expr: Any) -> Any:
    return cast((id_expr % 4294967296) - 2147483648, Integer)


def advisory_lock_free(*, objsubid: int, classid: str, objid: str) -> TextClause:
    """SQL: no session of this database holds the advisory lock that
    pg_locks shows as (classid, objid, objsubid): 1 for a single bigint
    key, 2 for a pair of int4 keys."""
    return text(
        "NOT EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.locktype = 'advisory'"
        f" AND l.granted AND l.objsubid = {int(objsubid)}"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND l.classid = {classid} AND l.objid = {objid})"
    )


@traversed_clauses("subquery")
class _array_of(ColumnElement[Any]):
    """``ARRAY(SELECT ...)``: the claim's subquery runs once, first, and the
    UPDATE then finds its rows through the primary key. (``id IN (SELECT ...)``
    was planned as a hash join over a scan of the whole table.)"""

    inherit_cache = True

    def __init__(self, subquery: Select[Any]) -> None:
        self.subquery = subquery.scalar_subquery()
        self.type = ARRAY(BigInteger)


@compiles(_array_of)
def _compile_array_of(element: _array_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"ARRAY({compiler.process(element.subquery, **kw)})"


def _commit_without_flush() -> ColumnElement[bool]:
    """A condition that is always true and makes the statement's own
    (autocommit) transaction commit without waiting for its WAL to reach
    disk: ``set_config(..., true)`` lasts until the transaction ends, which
    a statement in autocommit does right after it, so nothing leaks into the
    session (or, behind PgBouncer, into another client's). The planner runs
    it once, as a one-time filter.

    For the claim this is safe: a claim that a crash loses leaves its task
    ``pendente``, and no completion can outlive it. A crash ends every
    session, so the work's transaction dies with it; and WAL reaches disk in
    order, so the completion's synchronous commit flushes the claim before
    it. What it saves is one WAL flush per batch, the claim's, on the way
    from enqueue to handler."""
    setting = func.set_config("synchronous_commit", "off", true())
    return select(setting).scalar_subquery().is_not(None)


class PostgresAdapter(Adapter):
    family = "postgresql"
    skip_locked = True
    claim_autocommit = True
    supports_notify = True
    supports_task_locks = True
    supports_vacuum = True

    #: deadlock_detected, serialization_failure, lock_not_available
    TRANSIENT_SQLSTATES: ClassVar[frozenset[str]] = frozenset({"40P01", "40001", "55P03"})
    #: from this many rows insert_tasks uses COPY: its id prefetch costs one
    #: round trip more, which COPY wins back on runs this long with payloads
    #: (docs/benchmarks.md, "Figures formerly in code comments")
    COPY_THRESHOLD: ClassVar[int] = 64

    def is_transient(self, exc: BaseException) -> bool:
        sqlstate = getattr(getattr(exc, "orig", exc), "sqlstate", None)
        return sqlstate in self.TRANSIENT_SQLSTATES

    def _prepare(self) -> None:
        super()._prepare()
        #: task INSERTs in libpq's form, by paramstyle and columns (libpq.py)
        self._libpq_plans: dict[tuple[str, tuple[str, ...]], libpq.RowPlan | None] = {}
        #: the claim as the DBAPI cursor runs it, by dialect and LIMIT
        self._direct_claims: dict[tuple[Any, ...], _DirectClaim | None] = {}
        self._direct_statements: dict[tuple[Any, ...], _DirectStatement | None] = {}
        self._bucket_lock = text("SELECT pg_advisory_xact_lock(:ns, :bucket)")
        t = self.table
        c = t.c
        # The LIMIT is written into the SQL: bound, a generic plan reckons
        # with a tenth of the table, and once a VACUUM or ANALYZE has told
        # the planner the table's size, PostgreSQL's plan cache takes the
        # custom plans (LIMIT 1: far cheaper) and plans the claim at every
        # execution; one statement per batch size (a handful) instead.
        ready = (
            select(c.id)
            .where(*self._ready())
            .order_by(*self._claim_order)
            .limit(inline_count())
            .with_for_update(skip_locked=True)
        )
        initial = t.alias("inicial")
        initial_payload = select(initial.c.payload).where(initial.c.id == c.id_inicial)
        columns = [col for col in c if col.name != "payload"]
        returned = [
            *columns,
            func.coalesce(c.payload, initial_payload.scalar_subquery()).label("payload"),
            *self._claim_locks(),
        ]
        self._claim = (
            update(t)
            .where(c.id == any_(_array_of(ready)), _commit_without_flush())
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("owner"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
            .returning(*returned)
        )
        # "id = ANY(:ids)" has no plan that cannot go wrong by itself: a
        # generic plan counts ten ids, and on a table the planner has never
        # measured (ten pages, by its rule) ten index probes cost more than
        # reading the table, a plan then kept for as long as the statement
        # is prepared, whatever the table grows to. On the work connection
        # the completion is planned after SET LOCAL enable_seqscan = off;
        # the hand-back (rare) is one primary-key probe per row instead, an
        # executemany that psycopg pipelines.
        one = c.id == bindparam("b_id")
        self._plan_with_indexes = text("SELECT set_config('enable_seqscan', 'off', true)")
        self._hand_back_one = (
            update(t)
            .where(one, *self._claimed_by_owner)
            .values(
                status=Status.PENDING.value, worker_id=None, lease_expires_at=None, started_at=None
            )
        )
        self._unlock = text(f"SELECT count({TASK_UNLOCK}) {OVER_IDS}").bindparams(
            ns=self.task_lock_namespace
        )
        self._lost = self._lost.with_for_update(skip_locked=True)
        # renew only the rows no transaction holds: a handler that updates its
        # own task row must not stall the heartbeat of every lane
        mine = (
            select(c.id)
            .where(self._id_in("ids"), *self._claimed_by_owner)
            .with_for_update(skip_locked=True)
        )
        self._renew = (
            update(t)
            .where(c.id == any_(_array_of(mine)))
            .values(lease_expires_at=self.lease_deadline())
        )
        # due rows another transaction holds are left for the next round
        due = (
            select(c.id)
            .where(status_is(c.status, Status.SCHEDULED), c.data_hora <= func.now())
            .order_by(c.data_hora)
            .limit(PROMOTE_CHUNK)
            .with_for_update(skip_locked=True)
        )
        self._promote = (
            update(t).where(c.id == any_(_array_of(due))).values(status=Status.PENDING.value)
        )
        self._unnest_inserts = {}
        # The sequence is looked up once (a MATERIALIZED CTE): called per row,
        # pg_get_serial_sequence was most of the statement's time.
        self._next_ids = text(
            "WITH s AS MATERIALIZED "
            "(SELECT CAST(pg_get_serial_sequence(:table, 'id') AS regclass) AS seq) "
            "SELECT array_agg(nextval(s.seq)) FROM s CROSS JOIN generate_series(1, :n)"
        ).bindparams(table=self._quoted())
        self._rows_by_id = select(
            *columns, func.coalesce(c.payload, initial_payload.scalar_subquery()).label("payload")
        ).where(self._id_in("ids"))

    _unnest_inserts: dict[tuple[str, ...], Any]

    def _claim_locks(self) -> list[ColumnElement[Any]]:
        """The per-task locks the claim's RETURNING list takes, each a
        boolean column; :meth:`_keep_locked` reads them."""
        if not self.task_locks:
            return []
        ns = literal(self.task_lock_namespace, Integer)
        return [func.pg_try_advisory_lock(ns, _lock_objid(self.table.c.id)).label("sqlaq_locked")]

    def _keep_locked(
        self, conn: Connection, keys: Sequence[str], rows: Sequence[Sequence[Any]], owner: str
    ) -> list[Sequence[Any]]:
        """The claimed rows (the claim's RETURNING list, ``keys`` in order:
        SQLAlchemy's rows or the cursor's) whose locks were all taken; the
        others go back."""
        if not self.task_locks:
            return list(rows)
        id_at, locked_at = keys.index("id"), keys.index("sqlaq_locked")
        unlocked = [row[id_at] for row in rows if not row[locked_at]]
        if unlocked:
            # the lock key is taken by a task 2**32 ids away: run it later
            self.task_hand_back_many(conn, ids=unlocked, owner=owner)
            return [row for row in rows if row[locked_at]]
        return list(rows)

    def _quoted(self) -> str:
        t = self.table
        return f'"{t.schema}"."{t.name}"' if t.schema else f'"{t.name}"'

    def bucket_lock(
        self, conn: Connection, *, namespace: int, bucket: int, wait_seconds: float
    ) -> str | None:
        # freed by the commit
        conn.execute(self._bucket_lock, {"ns": namespace, "bucket": bucket})
        return None

    def routine_lock(self, engine: Engine) -> RoutineLock:
        if not self.task_locks:
            # per-task locks off: the sign of a transaction-pooling PgBouncer
            # (docs/pgbouncer.md), behind which session locks leak and an
            # open transaction pins a server connection: a lease row instead
            return LeaseRoutineLock(engine, self)
        return DatabaseRoutineLock(engine, self)

    def id_match(self, column: Any, name: str) -> ColumnElement[bool]:
        # one array parameter: a thousand expanded parameters cost more to
        # build than to run
        matched: ColumnElement[bool] = column == any_(cast(bindparam(name), ARRAY(BigInteger)))
        return matched

    def id_chunks(self, ids: Sequence[int]) -> list[list[int]]:
        return [list(ids)]  # one array, whatever its length

    def now(self) -> ColumnElement[dt.datetime]:
        # the transaction's start, unless the caller's transaction began
        # before the tasks it is to find were enqueued
        return func.clock_timestamp() if self.in_caller_transaction else func.now()

    def clock(self) -> ColumnElement[dt.datetime]:
        # now() is the transaction's start: a batch's sucesso would be dated
        # before its handlers ran
        return func.clock_timestamp()

    def lease_deadline(self) -> ColumnElement[dt.datetime]:
        # the database's clock, the one the rescue compares it with
        return func.clock_timestamp() + func.make_interval(
            0, 0, 0, 0, 0, 0, bindparam("lease_seconds", type_=Float)
        )

    def _lease_params(self, lease_seconds: float) -> dict[str, Any]:
        return {"lease_seconds": float(lease_seconds)}

    def _lease_lost(self) -> ColumnElement[bool]:
        """Expired, or (with task locks) no session of this database holds
        the task's advisory lock. pg_locks is read, not pg_try_advisory_lock:
        behind a transaction-pooling PgBouncer the try would succeed
        re-entrantly on the very server session that holds a live task's
        lock, and call it dead."""
        c = self.table.c
        expired = c.lease_expires_at < func.clock_timestamp()
        if not self.task_locks:
            return or_(c.lease_expires_at.is_(None), expired)
        lock_free = advisory_lock_free(
            objsubid=2,
            classid=f"CAST({int(self.task_lock_namespace)} AS int4)::oid",
            objid=f"((({self._quoted()}.id % 4294967296) - 2147483648)::int4)::oid",
        )
        return or_(expired, lock_free)

    def _id_in(self, name: str) -> ColumnElement[bool]:
        # one statement text for any number of ids: psycopg prepares it once
        return self.table.c.id == any_(cast(bindparam(name), ARRAY(BigInteger)))

    def _unnest_insert(self, columns: tuple[str, ...]) -> Any:
        statement = self._unnest_inserts.get(columns)
        if statement is None:
            dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
            # arrays of the unbounded type: an explicit cast to varchar(n)
            # would cut longer text silently; the INSERT's assignment cast
            # refuses it, as a plain INSERT does
            casts = ", ".join(
                f"CAST(:c{i} AS {_LENGTH.sub('', self.table.c[name].type.compile(dialect))}[])"
                for i, name in enumerate(columns)
            )
            names = ", ".join(f'"{name}"' for name in columns)
            statement = self._unnest_inserts[columns] = text(
                f"INSERT INTO {self._quoted()} ({names}) SELECT * FROM unnest({casts}) RETURNING id"
            )
        return statement

    def task_insert_one(self, conn: Connection, *, row: Mapping[str, Any]) -> int:
        """On psycopg 3, the INSERT straight to libpq where it can (libpq.py),
        from a plan per set of columns: the row's values, NULL for those it
        leaves None (the base class's statement leaves out those NULL by
        default: the same row). Otherwise, or when libpq.insert steps
        aside, the base class's statement on the cursor."""
        dialect = conn.dialect
        if dialect.driver == "psycopg" and statements_unobserved(conn):
            key = (dialect.paramstyle, tuple(row))
            plan = self._libpq_plans.get(key, _UNKNOWN)
            if plan is _UNKNOWN:
                plan = self._libpq_plans[key] = self._libpq_plan(dialect, key[1])
            if plan is not None:
                with DriverErrors(conn, plan.sql, row) as dbapi_connection:
                    new_id = libpq.insert(dbapi_connection, plan.statement, plan.values(row))
                if new_id is not None:
                    return new_id
        return super().task_insert_one(conn, row=row)

    def _libpq_plan(self, dialect: Dialect, columns: tuple[str, ...]) -> libpq.RowPlan | None:
        direct = self._direct_insert(dialect, columns)
        if direct is None or direct.order is not None or not direct.returning:
            return None
        c = self.table.c
        return libpq.row_plan(
            direct.sql,
            direct.defaults,
            dict(direct.processors),
            {name: c[name].type for name in (*columns, *direct.defaults)},
        )

    def task_insert_many(self, conn: Connection, *, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """From COPY_THRESHOLD rows on psycopg, COPY (see task_copy_many),
        unless something watches the connection's statements; else one
        ``INSERT ... SELECT * FROM unnest(arrays)``: a short statement
        whatever the number of rows (a VALUES list of thousands of
        parameters costs more to build and parse than to run)."""
        if (
            len(rows) >= self.COPY_THRESHOLD
            and self._can_copy(conn)
            and statements_unobserved(conn)
        ):
            return self.task_copy_many(conn, rows=rows)
        if len(rows) < 2:
            return super().task_insert_many(conn, rows=rows)
        columns = self._columns_of(rows)
        values = {f"c{i}": column for i, column in enumerate(columns.values())}
        ids = conn.execute(self._unnest_insert(tuple(columns)), values).scalars().all()
        # ids come from the sequence in the order unnest produced the rows
        return sorted(ids)

    def task_copy_many(self, conn: Connection, *, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Bulk insert with COPY: ids are drawn from the sequence first, so
        they are known and returned in order."""
        if not self._can_copy(conn):
            raise UnsupportedOperationError(
                f"COPY needs the psycopg (3) driver, not {conn.dialect.driver}; use insert_tasks"
            )
        if not rows:
            return []
        ids = sorted(conn.execute(self._next_ids, {"n": len(rows)}).scalar_one())
        columns = self._columns_of(rows)
        names = ", ".join(f'"{name}"' for name in ("id", *columns))
        statement = f"COPY {self._quoted()} ({names}) FROM STDIN"
        # conn.execute above began the transaction or refused a dead one
        _copy_rows(conn, statement, zip(ids, *columns.values(), strict=True))
        return ids

    def rows_insert_many(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """From COPY_THRESHOLD rows on psycopg, COPY (a group of 10,000
        steps: its steps and edges in 0.1 s rather than 1.2 s of
        executemany); else the executemany."""
        if not (
            len(rows) >= self.COPY_THRESHOLD
            and self._can_copy(conn)
            and statements_unobserved(conn)
        ):
            super().rows_insert_many(conn, table, rows)
            return
        names = list(rows[0])
        quote = conn.dialect.identifier_preparer
        statement = (
            f"COPY {quote.format_table(table)} "
            f"({', '.join(quote.quote(name) for name in names)}) FROM STDIN"
        )
        conn.execute(select(literal(1)))  # begins the transaction, or refuses a dead one
        _copy_rows(conn, statement, (tuple(row[name] for name in names) for row in rows))

    def task_copy_text(
        self, conn: Connection, *, columns: Sequence[str], chunks: Iterable[str]
    ) -> None:
        """COPY rows that the caller wrote in COPY's text format, ``chunks``
        of whole lines (tab between values, ``\\N`` for NULL, backslash,
        tab, newline and carriage return escaped): the bulk path that makes
        no Python object per value. ``id`` and the columns not named take
        their defaults. The caller checks :meth:`can_copy_text` first."""
        from psycopg.copy import QueuedLibpqWriter

        for name in columns:
            self.table.c[name]  # KeyError for a column the table lacks

        names = ", ".join(f'"{name}"' for name in columns)
        statement = f"COPY {self._quoted()} ({names}) FROM STDIN"
        # a thread of psycopg's sends while the caller makes the next chunk
        with (
            driver_cursor(conn, statement) as cursor,
            cursor.copy(statement, writer=QueuedLibpqWriter(cursor)) as copy,
        ):
            for chunk in chunks:
                copy.write(chunk)

    def can_copy_text(self, conn: Connection) -> bool:
        """Whether :meth:`task_copy_text` may run on ``conn`` now: psycopg's
        sync mode, in a transaction that nothing watches (see
        statements_unobserved)."""
        return self._can_copy(conn) and not conn.dialect.is_async and statements_unobserved(conn)

    @staticmethod
    def _can_copy(conn: Connection) -> bool:
        # psycopg's async dialect is named "psycopg" too (is_async tells them apart)
        return conn.dialect.driver == "psycopg"

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        lease = self._lease_params(lease_seconds)
        if conn.info.get(_PROXIED):
            # no session settings through a pooler (own_connection): the
            # claim's plan settings for its own transaction only
            conn.execute(_PLAN_SETTINGS_LOCAL)
        direct = self._direct_claim(conn.dialect, limit) if statements_unobserved(conn) else None
        if direct is None:
            result = conn.execute(self._claim, {"limit": limit, "owner": owner, **lease})
            keys = list(result.keys())
            return self._records(keys, self._keep_locked(conn, keys, result.all(), owner), conn)
        statement = direct.statement
        bound = statement.bound({"owner": owner, **lease})
        with driver_cursor(conn, statement.sql, bound) as cursor:
            cursor.execute(statement.sql, bound)
            found = cursor.fetchall()
        if direct.results:
            found = [_processed(row, direct.results) for row in found]
        return self._records(direct.keys, self._keep_locked(conn, direct.keys, found, owner), conn)

    def _direct_claim(self, dialect: Dialect, limit: int) -> _DirectClaim | None:
        """The claim for ``limit`` rows compiled once for ``dialect``, to run
        on the DBAPI cursor: SQLAlchemy's per-execute work (cache key,
        parameters, execution context, the result's metadata for some 35
        columns) took about as long as the claim's round trip on an idle
        worker's path from NOTIFY to handler (docs/benchmarks.md)."""
        key = (dialect.name, dialect.driver, dialect.paramstyle, limit)
        return _compiled_once(
            self._direct_claims, key, lambda: _compile_direct_claim(self._claim, dialect, limit)
        )

    def _rowcount(
        self, conn: Connection, statement: Any, values: Mapping[str, Any], *, alone: bool = False
    ) -> int:
        """On the DBAPI cursor, compiled once, as the claim: the completion
        of a batch of one (every task of an idle worker's) and the lock
        release after each batch each paid SQLAlchemy's per-execute work
        (docs/benchmarks.md). Through ``conn.execute`` where something
        observes the connection's statements, or where the statement cannot
        run on the cursor as SQLAlchemy would run it (:func:`_compile_direct`).

        ``alone`` (the completion of a batch of one, whose transaction
        commits next): when the handler sent nothing, psycopg has not begun
        the transaction yet (it sends ``BEGIN`` before the first statement),
        and the statement runs in autocommit instead: one round trip, not
        three (``BEGIN``, it, ``COMMIT``). The transaction would have held
        this one statement; SQLAlchemy's commit then finds nothing to commit."""
        if not statements_unobserved(conn):
            return super()._rowcount(conn, statement, values)
        dialect = conn.dialect
        key = (id(statement), dialect.name, dialect.driver, dialect.paramstyle)
        direct = _compiled_once(
            self._direct_statements,
            key,
            lambda: _compile_direct(statement, dialect, frozenset(values)),
        )
        if direct is None:
            return super()._rowcount(conn, statement, values)
        bound = direct.bound(values)
        by_itself = _not_begun(conn) if alone else None
        with driver_cursor(conn, direct.sql, bound) as cursor:
            if by_itself is not None:
                by_itself.autocommit = True
            try:
                cursor.execute(direct.sql, bound)
            finally:
                if by_itself is not None:
                    with contextlib.suppress(Exception):  # a lost connection: invalidated
                        by_itself.autocommit = False
            return int(cursor.rowcount)

    def task_complete_many(
        self,
        conn: Connection,
        *,
        results: Sequence[tuple[int, str | None]],
        owner: str,
        commits: bool = False,
    ) -> int:
        """One ``id = ANY(:ids)`` statement, planned without sequential scans:
        the completion is the last statement of the batch's transaction (the
        handlers ran before it), so ``SET LOCAL enable_seqscan = off`` there
        touches no statement of the application, and ends with the commit.
        (One statement per task, an executemany, cost half the batched
        worker's rate: docs/benchmarks.md, (g).)"""
        if len(results) > 1:  # one task: a primary-key probe, whatever the plan
            conn.execute(self._plan_with_indexes)
        return super().task_complete_many(conn, results=results, owner=owner, commits=commits)

    def task_hand_back_many(self, conn: Connection, *, ids: Sequence[int], owner: str) -> int:
        if not ids:
            return 0
        rows = [{"b_id": task_id, "owner": owner} for task_id in ids]
        return int(conn.execute(self._hand_back_one, rows).rowcount)

    # ------------------------------------------------------------ connections
    def connect_claim(self, engine: Engine) -> Connection:
        return self.own_connection(super().connect_claim(engine))

    def connect_maintenance(self, engine: Engine) -> Connection:
        return self.own_connection(super().connect_maintenance(engine))

    def own_connection(self, conn: Connection) -> Connection:
        """Settings for a connection that carries only the worker's statements.

        The claim, the heartbeat and the routines run on connections that
        carry no application statement, so a session setting there touches
        nothing else:

        - ``enable_seqscan = off`` makes every plan of ours that can use an
          index use it, whatever the statistics say, prepared or not.
          Without it a table that PostgreSQL never analysed (autovacuum late
          or off; a new table) is costed at ten pages, a full scan looks
          cheaper than a few index probes, and a prepared statement keeps
          that generic plan while the table grows (docs/benchmarks.md, (g)).
        - ``jit = off`` (PostgreSQL 11+): a plan that has to read a table
          whole (an index missing, dropped or not yet made) is costed at
          ``enable_seqscan``'s ten billion, far past ``jit_above_cost``,
          and PostgreSQL then compiled the claim at every run, which cost
          far more than the claim itself, even on an empty table. Our
          statements read a few rows; JIT never pays for them.
        - ``plan_cache_mode = force_generic_plan`` (PostgreSQL 12+): a
          prepared statement keeps the one plan made for it, whose index
          use tests/adapters/test_plans.py checks. Left to choose, once a
          VACUUM had told the planner the table's size the plan cache
          switched the claim to custom plans, made at every execution:
          the long-horizon latency at ``--batch-size 1`` then grew with
          the table (docs/benchmarks.md, (g)).
        - ``idle_session_timeout = 0`` (PostgreSQL 14+): a lane's claim
          connection is idle while its handlers run, and holds their
          per-task locks; a server that ends idle sessions would free them
          and the rescue would take a healthy worker's tasks
          (docs/lifecycle.md, "Idle timeouts").

        Set once per server session, and reset when the connection goes back
        to the pool (where a handler's session may take it next). Not behind
        a transaction-pooling PgBouncer (``task_locks`` off), nor on a
        connection through any pooler or proxy (:func:`_note_proxy`): a
        session setting would reach another client's statements there; the
        claim then sets the plan settings for its own transaction."""
        if not self.task_locks or conn.info.get(_PROXIED):
            return conn
        names = _session_settings(conn.dialect.server_version_info)
        if self.dead_peer_seconds is not None:
            # our own transactions are short: one a cut-off worker left
            # open ends with its session within the bound (liveness.py)
            bound = str(int(self.dead_peer_seconds * 1000))
            names.append(("idle_in_transaction_session_timeout", bound))

        def apply(conn: Connection) -> list[str]:
            for name, value in names:
                conn.execute(text("SELECT set_config(:n, :v, false)"), {"n": name, "v": value})
            return [name for name, _ in names]

        _set_once_per_session(conn, apply)
        return conn

    # ------------------------------------------------------------ vacuum
    def table_vacuum_state(self, conn: Connection, horizon_seconds: float) -> VacuumState:
        dead, next_xid = conn.execute(_DEAD_TUPLES, {"table": self._quoted()}).one()
        rows = conn.execute(_HORIZON_HOLDERS, {"seconds": float(horizon_seconds)})
        holders = tuple(
            HorizonHolder(
                # a gid is the application's text: one line, whatever it holds
                what=escape_controls(row.what),
                pin=row.pin,
                xids=int(row.xids),
                seconds=None if row.seconds is None else float(row.seconds),
            )
            for row in rows
        )
        return VacuumState(int(dead or 0), int(next_xid), holders)

    def table_health(self, conn: Connection) -> TableHealth | None:
        table = self._quoted()
        sizes = conn.execute(_TABLE_HEALTH, {"table": table}).first()
        if sizes is None:
            return None
        holder = conn.execute(_OLDEST_SNAPSHOT).first()
        others = tuple(conn.execute(_OTHER_HOLDERS).scalars())
        return TableHealth(
            table_bytes=int(sizes.table_bytes or 0),
            index_bytes=int(sizes.index_bytes or 0),
            dead_tuples=int(sizes.dead_tuples or 0),
            live_tuples=int(sizes.live_tuples or 0),
            horizon_seconds=None if holder is None else float(holder.seconds or 0.0),
            horizon_holder=None if holder is None else str(holder.what),
            horizon_others=others,
        )

    def table_vacuum(self, conn: Connection) -> None:
        if conn.in_transaction():
            conn.commit()
        statement = f"VACUUM (ANALYZE, SKIP_LOCKED) {self._quoted()}"
        # VACUUM refuses to run in a transaction: the driver's autocommit,
        # for this one statement
        with driver_cursor(conn, statement) as cursor:
            dbapi_connection = conn.connection.dbapi_connection
            assert dbapi_connection is not None
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            try:
                cursor.execute(statement)
            finally:
                dbapi_connection.autocommit = autocommit

    def lock_release_many(self, conn: Connection, *, ids: Any) -> None:
        if ids and self.task_locks:
            self._rowcount(conn, self._unlock, {"ids": list(ids)})

    def is_permanent(self, exc: BaseException) -> bool:
        # 28xxx authentication, 3D000 no such database, 42xxx a missing
        # table or privilege: waiting does not make them go away. A refused
        # login carries no SQLSTATE in psycopg (libpq reports it as text)
        orig = getattr(exc, "orig", exc)
        sqlstate = getattr(orig, "sqlstate", None) or ""
        if sqlstate[:2] in ("28", "42") or sqlstate == "3D000":
            return True
        return sqlstate == "" and _REFUSED_LOGIN.search(str(orig)) is not None

    def lock_try(self, conn: Connection, *, key: int) -> bool:
        return bool(
            conn.execute(
                text("SELECT pg_try_advisory_lock(:ns, :key)"),
                {"ns": self.maintenance_lock_namespace, "key": key},
            ).scalar()
        )

    def lock_release(self, conn: Connection, *, key: int) -> None:
        conn.execute(
            text("SELECT pg_advisory_unlock(:ns, :key)"),
            {"ns": self.maintenance_lock_namespace, "key": key},
        )

    def prepare_engine(self, engine: Engine) -> None:
        """Tell, on each new connection, whether a pooler or proxy stands
        between this process and the server (:func:`_note_proxy`): the
        worker's session settings are made only where none does."""
        if not event.contains(engine, "connect", _note_proxy):
            event.listen(engine, "connect", _note_proxy, insert=True)
            # a connection the pool made before: told at its next checkout
            event.listen(engine, "checkout", _note_proxy_once)

    def proxied(self, conn: Connection) -> bool:
        return bool(conn.info.get(_PROXIED))

    def keep_lane_session(self, conn: Connection) -> None:
        """A lane's work connection is idle while a handler works before its
        first statement, and idle in a transaction while one works after
        it: ``idle_session_timeout`` and ``idle_in_transaction_session_timeout``
        (PostgreSQL 14+, 9.6+) set low on the server would end it under a
        healthy task, which would fail at every attempt. Both off for this
        session, reset when the connection goes back to the pool; the
        dead-peer bound (TCP keepalive, liveness.py) still ends the session
        of a worker cut off by the network. Not through a pooler or proxy
        (the server's sessions are the pooler's there)."""
        if conn.info.get(_PROXIED):
            return
        _set_once_per_session(
            conn, lambda conn: list(conn.execute(_LANE_SESSION_SETTINGS).scalars())
        )

    def guard_dead_peers(self, engine: Engine, *, server_side: bool = True) -> None:
        """libpq's keepalive and ``tcp_user_timeout`` parameters on every new
        connection (those the URL or ``connect_args`` give win), and the
        server's side of each session set the same (``tcp_keepalives_*``,
        ``tcp_user_timeout``), so that the server ends a silent worker's
        backends. Not behind a transaction-pooling PgBouncer (``server_side``
        false: the worker asked for no task locks): there the server's peer
        is PgBouncer, whose own keepalive settings decide (docs/pgbouncer.md),
        and a session setting would reach another client."""
        if self.dead_peer_seconds is not None:
            _guard(engine, Keepalive.within(self.dead_peer_seconds), server_side=server_side)

    def name_session(self, conn: Connection, name: str, *, local: bool = False) -> None:
        if not local and conn.info.get(_PROXIED):
            return
        conn.execute(
            text("SELECT set_config('application_name', :name, :local)"),
            {"name": name[:63], "local": local},
        )

    def routine_lock_holders(
        self, conn: Connection, *, keys: Mapping[int, str]
    ) -> list[LockHolder]:
        # a pair of int4 keys shows in pg_locks as (classid, objid) as oids
        names = {key & 0xFFFFFFFF: name for key, name in keys.items()}
        # pg_stat_activity is read once per transaction and kept: a caller that
        # read it before (the vacuum horizon) would join today's locks to
        # sessions as they were then (a lock's session not yet named)
        conn.execute(_CLEAR_STATS_SNAPSHOT)
        rows = conn.execute(
            _ROUTINE_LOCK_HOLDERS, {"ns": self.maintenance_lock_namespace & 0xFFFFFFFF}
        ).all()
        return [
            LockHolder(
                routine=names[row.key],
                session=int(row.pid),
                worker=_worker_of(row.application_name),
                client=row.client,
                connected_at=row.backend_start,
                silent_seconds=None if row.silent is None else float(row.silent),
            )
            for row in rows
            if row.key in names
        ]

    def end_when_idle(self, conn: Connection, seconds: float, *, local: bool = False) -> None:
        if not local and conn.info.get(_PROXIED):
            return  # a session setting would reach the pooler's other clients
        names = ["idle_in_transaction_session_timeout"]
        if not local:
            names.append("idle_session_timeout")
        conn.execute(
            text(
                "SELECT set_config(s.name, :value, :local) FROM pg_settings AS s "
                "WHERE s.name = ANY(:names)"
            ),
            {"value": str(int(seconds * 1000)), "local": local, "names": names},
        )

    def notify(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": self.channel})

    def listener(self, engine: Engine) -> Listener:
        return PostgresListener(engine, self.channel)


#: the queue table's dead tuples, and the next transaction id (64 bits)
_DEAD_TUPLES = text(
    "SELECT (SELECT n_dead_tup FROM pg_stat_all_tables WHERE relid = to_regclass(:table)),"
    " txid_snapshot_xmax(txid_current_snapshot())"
)
#: what holds the vacuum horizon of this database's tables, oldest first
#: (by ``age()``, which counts across the transaction id's wraparound),
#: as PostgreSQL computes it (procarray.c, ComputeXidHorizons): the
#: sessions of this database (and those of none: walsenders) by the older
#: of their snapshot's xmin and their own transaction id (a transaction that
#: wrote holds its id even with no snapshot: READ COMMITTED, idle in
#: transaction), in a transaction for ``:seconds``; this database's prepared
#: transactions prepared that long ago; the replication slots' xmin; the
#: standbys' xmin (hot_standby_feedback without a slot). Not a logical
#: slot's catalog_xmin: it holds back only the catalogs' vacuum. One line
#: each; a session's query text never.
_HORIZON_HOLDERS = text(
    "SELECT what, pin, xids, seconds FROM ("
    " SELECT format('pid %s (%s, %s, application %L%s) for %s s', pid, state,"
    "  coalesce(backend_type, ''), application_name,"
    "  CASE WHEN backend_xmin IS NULL THEN ', a transaction id and no snapshot' ELSE '' END,"
    "  round(extract(epoch FROM clock_timestamp() - xact_start))) AS what,"
    "  format('pid %s since %s', pid, xact_start) AS pin,"
    "  greatest(age(backend_xmin), age(backend_xid)) AS xids,"
    "  extract(epoch FROM clock_timestamp() - xact_start) AS seconds"
    " FROM pg_stat_activity"
    " WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()"
    "  AND (datname = current_database() OR datname IS NULL)"
    "  AND xact_start < clock_timestamp() - make_interval(secs => :seconds)"
    " UNION ALL"
    " SELECT format('prepared transaction %L (owner %s) for %s s', gid, owner,"
    "  round(extract(epoch FROM clock_timestamp() - prepared))),"
    "  format('prepared %s', gid), age(transaction),"
    "  extract(epoch FROM clock_timestamp() - prepared)"
    " FROM pg_prepared_xacts WHERE database = current_database()"
    "  AND prepared < clock_timestamp() - make_interval(secs => :seconds)"
    " UNION ALL"
    " SELECT format('replication slot %L (%s, %s)', slot_name, slot_type,"
    "  CASE WHEN active THEN 'active' ELSE 'inactive' END),"
    "  format('slot %s', slot_name), age(xmin), NULL"
    " FROM pg_replication_slots WHERE xmin IS NOT NULL"
    " UNION ALL"
    " SELECT format('standby %L (walsender pid %s, client %s)', application_name, pid,"
    "  coalesce(host(client_addr), 'local')),"
    "  format('standby %s', pid), age(backend_xmin), NULL"
    " FROM pg_stat_replication WHERE backend_xmin IS NOT NULL"
    ") AS holders ORDER BY xids DESC LIMIT 20"
)


_TABLE_HEALTH = text(
    "SELECT pg_table_size(relid) AS table_bytes, pg_indexes_size(relid) AS index_bytes,"
    " n_dead_tup AS dead_tuples, n_live_tup AS live_tuples"
    " FROM pg_stat_all_tables WHERE relid = to_regclass(:table)"
)
# the oldest snapshot or transaction id another session of this database
# holds (see _HORIZON_HOLDERS), and since when
_OLDEST_SNAPSHOT = text(
    "SELECT format('pid %s (%s, %s, application %L)', pid, state,"
    "  coalesce(backend_type, ''), application_name) AS what,"
    " extract(epoch FROM clock_timestamp() - coalesce(xact_start, backend_start)) AS seconds"
    " FROM pg_stat_activity"
    " WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()"
    "  AND (datname = current_database() OR datname IS NULL)"
    " ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC LIMIT 1"
)
_OTHER_HOLDERS = text(
    "SELECT format('replication slot %L (%s transactions behind)', slot_name, age(xmin))"
    " FROM pg_replication_slots WHERE xmin IS NOT NULL"
    " UNION ALL"
    " SELECT format('prepared transaction %L (since %s)', gid, prepared)"
    " FROM pg_prepared_xacts"
)


def _session_settings(version: tuple[Any, ...] | None) -> list[tuple[str, str]]:
    """The SESSION_SETTINGS a server of ``version`` has."""
    major = tuple(version or (0,))[:1]
    return [(name, value) for name, value, since in SESSION_SETTINGS if major >= since]


_CLEAR_STATS_SNAPSHOT = text("SELECT pg_stat_clear_snapshot()")

#: the routine locks held (advisory, a pair of int4 keys: the queue's
#: maintenance namespace and the routine's key), with their sessions
_ROUTINE_LOCK_HOLDERS = text(
    "SELECT l.objid::bigint AS key, a.pid, a.application_name, host(a.client_addr) AS client,"
    " a.backend_start, extract(epoch FROM clock_timestamp() - a.state_change) AS silent"
    " FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid::bigint = :ns ORDER BY l.objid"
)


def _worker_of(application_name: str | None) -> str | None:
    if application_name and application_name.startswith(SESSION_NAME):
        return application_name[len(SESSION_NAME) :]
    return None


def _guard(engine: Engine, keepalive: Keepalive, *, server_side: bool) -> None:
    """Give ``engine``'s new connections ``keepalive`` (see guard_dead_peers);
    the listeners once per engine, the latest values winning."""
    if remember(engine, (keepalive, server_side)):
        event.listen(engine, "do_connect", on_new_connections(engine, _client_side))
        event.listen(engine, "connect", on_new_connections(engine, _server_side))


def _client_side(
    guard: tuple[Keepalive, bool], dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]
) -> None:
    k = guard[0]
    cparams.setdefault("keepalives", 1)
    cparams.setdefault("keepalives_idle", k.idle)
    cparams.setdefault("keepalives_interval", k.interval)
    cparams.setdefault("keepalives_count", k.count)
    cparams.setdefault("tcp_user_timeout", k.user_timeout_ms)
    # a connection attempt into a cut waits out the system's SYN retries
    # (two minutes) without it: the worker's recovery after the heal
    cparams.setdefault("connect_timeout", k.connect_timeout)


def _server_side(guard: tuple[Keepalive, bool], dbapi_connection: Any, record: Any) -> None:
    k, server_side = guard
    if not server_side or record.info.get(_PROXIED):
        return
    values = (
        ("tcp_keepalives_idle", k.idle),
        ("tcp_keepalives_interval", k.interval),
        ("tcp_keepalives_count", k.count),
        ("tcp_user_timeout", k.user_timeout_ms),
    )
    # the settings this server has (tcp_user_timeout: 12+); over a Unix
    # socket the server ignores them. Whole numbers of ours, no input
    rows = ", ".join(f"('{name}', '{int(value)}')" for name, value in values)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SELECT set_config(s.name, v.value, false) FROM (VALUES "
            + rows
            + ") AS v(name, value) JOIN pg_settings AS s ON s.name = v.name"
        )
    finally:
        cursor.close()
    dbapi_connection.commit()


def _note_proxy(dbapi_connection: Any, record: Any) -> None:
    """Record in ``record.info`` whether this connection reaches the server
    through a pooler or proxy (PgBouncer, pgcat, a TCP proxy): the server
    then sees another client socket than this process's own. Compared by
    port (and by kind: one side a Unix socket, the other TCP). A driver
    whose socket cannot be read counts as direct, as before."""
    local = _local_port(dbapi_connection)
    if local is _UNKNOWN:
        record.info[_PROXIED] = False
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT inet_client_port()")
        row = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.commit()
    seen = None if row is None else row[0]
    record.info[_PROXIED] = seen != local
    if record.info[_PROXIED]:
        logger.debug("connection through a pooler or proxy: no session settings")


def _note_proxy_once(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    if _PROXIED not in record.info:
        _note_proxy(dbapi_connection, record)


_UNKNOWN = object()


def _local_port(dbapi_connection: Any) -> Any:
    """This process's port of ``dbapi_connection``'s socket (None: a Unix
    socket); _UNKNOWN where the driver does not say."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    pgconn = getattr(driver, "pgconn", None)
    fileno = getattr(pgconn, "socket", None)
    if not isinstance(fileno, int):
        return _UNKNOWN
    try:
        with socket.socket(fileno=os.dup(fileno)) as sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            return int(sock.getsockname()[1])
    except OSError:
        return _UNKNOWN


def _set_once_per_session(conn: Connection, apply: Callable[[Connection], list[str]]) -> None:
    """Run ``apply`` (session settings; the names it set) once per server
    session of ``conn``, the names kept for :func:`_reset_session` at the
    pool's check-in."""
    record = conn.connection
    if record.info.get(_SESSION_MARK):
        return
    pool = conn.engine.pool
    if not event.contains(pool, "checkin", _reset_session):
        event.listen(pool, "checkin", _reset_session)
    with conn.begin() if not conn.in_transaction() else contextlib.nullcontext():
        names = apply(conn)
    record.info[_SESSION_MARK] = names


def _reset_session(dbapi_connection: Any, record: Any) -> None:
    """Pool check-in: a connection that ran the worker's own statements goes
    back with the server's settings."""
    names = record.info.pop(_SESSION_MARK, None)
    if not names or dbapi_connection is None:
        return
    try:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        for name in names:
            dbapi_connection.execute(f"RESET {name}")
        dbapi_connection.autocommit = autocommit
    except Exception:  # a broken connection: the pool's own check will drop it
        record.invalidate()


def _compiled_once(
    cache: dict[tuple[Any, ...], _T], key: tuple[Any, ...], build: Callable[[], _T]
) -> _T:
    """``cache[key]``, built at the first call (a race builds it twice,
    harmlessly); the cache starts over past ``DIRECT_KEPT`` entries."""
    if key not in cache:
        if len(cache) > DIRECT_KEPT:
            cache.clear()
        cache[key] = build()
    return cache[key]


def _not_begun(conn: Connection) -> Any:
    """``conn``'s psycopg 3 (sync) connection if it has sent nothing in the
    transaction SQLAlchemy began, and is not in autocommit; else None."""
    if conn.dialect.driver != "psycopg" or conn.dialect.is_async:
        return None
    dbapi_connection: Any = conn.connection.dbapi_connection
    status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)
    if getattr(status, "name", None) != "IDLE" or dbapi_connection.autocommit:
        return None
    return dbapi_connection


class _DirectStatement(NamedTuple):
    """A statement compiled by SQLAlchemy for one dialect, run on the DBAPI
    cursor with the parameters ``conn.execute`` would send."""

    sql: str
    constants: Mapping[str, Any]  # every bound value but the variable ones, processed
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]  # for the variable ones

    def bound(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters for the variable ``values``."""
        bound = {**self.constants, **values}
        for name, process in self.processors:
            bound[name] = process(bound[name])
        return bound


class _DirectClaim(NamedTuple):
    """The claim compiled by SQLAlchemy for one dialect and LIMIT, run on the
    DBAPI cursor (:meth:`PostgresAdapter.task_claim_many`)."""

    statement: _DirectStatement  # its variable parameters: owner and lease_seconds
    keys: tuple[str, ...]  # the RETURNING list's names, in order
    results: tuple[tuple[int, Callable[[Any], Any]], ...]  # result processors by position


def _processed(
    row: Sequence[Any], processors: Sequence[tuple[int, Callable[[Any], Any]]]
) -> list[Any]:
    values = list(row)
    for at, process in processors:
        values[at] = process(values[at])
    return values


def _compile_direct_claim(claim: Any, dialect: Dialect, limit: int) -> _DirectClaim | None:
    """``claim`` compiled for the DBAPI cursor, its LIMIT (and any list of
    the claim filter's) written into the SQL as ``conn.execute`` writes
    them; None where the cursor's call could differ from SQLAlchemy's (a
    positional paramstyle, bind names it escapes, a value computed at each
    execution: the claim filter's ``callable_`` binds), or where a column
    of the user's model comes back (its type's result processor may depend
    on the driver's type code, which only the cursor's description has)."""
    returned = list(claim.exported_columns)
    keys = tuple(column.key for column in returned)
    if not set(keys) <= _CLAIM_KEYS:
        return None
    statement = _compile_direct(
        claim, dialect, frozenset({"owner", "lease_seconds"}), literal={"limit": int(limit)}
    )
    if statement is None:
        return None
    results = []
    for at, column in enumerate(returned):
        try:  # without the cursor's type code: a type that needs it says so
            process = column.type.dialect_impl(dialect).result_processor(dialect, None)
        except Exception:
            return None
        if process is not None:
            results.append((at, process))
    return _DirectClaim(statement=statement, keys=keys, results=tuple(results))


def _compile_direct(
    statement: Any,
    dialect: Dialect,
    variable: frozenset[str],
    *,
    literal: Mapping[str, Any] | None = None,
) -> _DirectStatement | None:
    """``statement`` compiled for the DBAPI cursor, the ``variable`` binds
    left to each execution and the ``literal`` ones written into the SQL
    (post-compile, as ``conn.execute`` writes them); None where the cursor's
    call could differ from SQLAlchemy's: a positional paramstyle, a bind
    computed at each execution (``callable_``), a ``literal`` one that
    stayed a parameter."""
    if dialect.positional:
        return None
    compiled = statement.compile(dialect=dialect)
    if not variable <= set(compiled.binds) or any(
        bind.callable is not None for bind in compiled.binds.values()
    ):
        return None
    literal = literal or {}
    state = compiled.construct_expanded_state({**literal, **dict.fromkeys(variable)})
    if any(name in state.parameters for name in literal):
        return None
    constants: dict[str, Any] = {}
    for name, value in state.parameters.items():
        if name not in variable:
            process = state.processors.get(name)
            constants[name] = value if process is None else process(value)
    processors = tuple(
        (name, state.processors[name]) for name in sorted(variable) if name in state.processors
    )
    return _DirectStatement(sql=state.statement, constants=constants, processors=processors)


class PostgresListener(Listener):
    """A thread that LISTENs on its own connection and sets the wake event.

    After any reconnect it wakes the lanes too: notifications sent while it
    was away are lost, so they must look for themselves."""

    def __init__(self, engine: Engine, channel: str) -> None:
        self.engine = engine
        self.channel = channel
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()

    def start(self, wake: Wake) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(wake,), name=f"sqla-queue-listen-{self.channel}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=LISTEN_POLL_SECONDS * 3)

    def _connect(self) -> Any:
        raw = self.engine.raw_connection()
        dbapi_conn = raw.driver_connection
        assert dbapi_conn is not None
        raw.detach()  # ours alone: it never goes back to the pool
        dbapi_conn.autocommit = True
        if not raw.info.get(_PROXIED):
            # idle by design: a server's idle_session_timeout would end it
            # every few seconds (its notifications lost in between)
            dbapi_conn.execute(_LISTEN_SESSION_SETTINGS)
        dbapi_conn.execute(f'LISTEN "{self.channel}"')
        return dbapi_conn

    def _run(self, wake: Wake) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # the database is away: retry
                # the lanes say that the database is away, once each: here one
                # line per outage, and retries a few seconds apart while it lasts
                log = logger.info if failures == 0 else logger.debug
                first_line = describe_error(exc).splitlines()[0]
                log("LISTEN %s failed: %s; retrying", self.channel, first_line)
                self._stop.wait(
                    min(RECONNECT_DELAY_SECONDS * 2**failures, LISTEN_RETRY_MAX_SECONDS)
                )
                failures += 1
                continue
            if failures:
                logger.info("LISTEN %s listening again", self.channel)
                failures = 0
            self.listening.set()
            wake.set()
            try:
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=LISTEN_POLL_SECONDS, stop_after=1):
                        wake.set()
            except Exception as exc:
                logger.warning(
                    "LISTEN %s lost its connection: %s", self.channel, describe_error(exc)
                )
                self.listening.clear()
            finally:
                with contextlib.suppress(Exception):
                    conn.close()


def _copy_rows(conn: Connection, statement: str, rows: Iterable[Sequence[Any]]) -> None:
    """COPY ``rows`` (tuples in the statement's column order) on psycopg,
    sync or async; the caller has begun the transaction."""
    with driver_cursor(conn, statement) as cursor:
        if conn.dialect.is_async:
            _copy_async(conn, statement, rows)
        else:
            with cursor.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)


def _copy_async(conn: Connection, statement: str, rows: Iterable[Sequence[Any]]) -> None:
    """COPY ``rows`` on the psycopg AsyncConnection under ``conn`` (an
    AsyncSession's or AsyncConnection's sync facade, in SQLAlchemy's
    greenlet): SQLAlchemy's adapted cursor has no ``copy()``, so the
    driver's own cursor copies, awaited from the greenlet in one go."""
    from sqlalchemy.util import await_only

    driver_connection: Any = conn.connection.driver_connection

    async def copy() -> None:
        async with driver_connection.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                await copy.write_row(row)

    await_only(copy())
