"""MySQL and MariaDB: SKIP LOCKED claims, leases, and GET_LOCK per task.

There is no UPDATE ... RETURNING, so a claim is a short transaction on the
claim connection: select ready rows ``FOR UPDATE SKIP LOCKED`` (MariaDB 10.6+,
MySQL 8.0+), take a ``GET_LOCK`` per task (session-level: it dies with the
connection, so the rescue sees a killed worker at once), mark them
``processando`` with the worker's id and a lease, commit. The lock only makes
the rescue faster: a task whose lease is still renewed is never rescued
because its lock looks free, and completion is guarded by the claim.
Wake-ups are by polling: MySQL has no LISTEN/NOTIFY.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    bindparam,
    event,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from ..common.exceptions import SqlaQueueError
from ..common.redaction import describe_error
from ..schema.mixins import Status, inline_count, status_is
from ..schema.records import TaskRecord
from .base import PROMOTE_CHUNK, Adapter, LockHolder
from .liveness import Keepalive, keep_socket_alive, on_new_connections, remember
from .locks import DatabaseRoutineLock, RoutineLock

logger = logging.getLogger("sqla_queue.batch.manager")

#: the lanes of one worker whose working sessions end_sessions looks for
#: (a worker's concurrency beyond it leaves the later lanes to the server's
#: keepalive)
SESSION_SLOTS = 128


class MySQLAdapter(Adapter):
    family = "mysql"
    claim_autocommit = False
    supports_task_locks = True
    #: SELECT ... FOR UPDATE SKIP LOCKED (MariaDB 10.6+, MySQL 8.0+)
    skip_locked: ClassVar[bool] = True

    def connect_bulk(self, engine: Engine) -> Connection:
        return engine.connect().execution_options(isolation_level="READ COMMITTED")

    def bucket_lock(
        self, conn: Connection, *, namespace: int, bucket: int, wait_seconds: float
    ) -> str | None:
        # GET_LOCK outlives the transaction: the caller frees it after COMMIT
        name = f"sqlaq:{namespace & 0xFFFFFFFF:08x}:dedupe:{bucket}"
        got = conn.execute(
            text("SELECT GET_LOCK(:name, :wait)"), {"name": name, "wait": wait_seconds}
        ).scalar()
        if got != 1:
            raise SqlaQueueError(f"dedupe lock {name} not obtained in {wait_seconds:g} s")
        return name

    def bucket_unlock(self, conn: Connection, name: str) -> None:
        conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})

    def routine_lock(self, engine: Engine) -> RoutineLock:
        return DatabaseRoutineLock(engine, self)

    def guard_dead_peers(self, engine: Engine, *, server_side: bool = True) -> None:
        """TCP keepalive and ``TCP_USER_TIMEOUT`` on each new connection's
        socket (PyMySQL's), so that the worker sees a silent server within
        the bound. The server's side of a session cannot choose its
        keepalive here (``tcp_keepalive_time`` and its kin are global in
        MariaDB): what a cut-off worker's session holds is freed by the
        server's timeouts instead, ``end_when_idle`` for the routine lock and
        ``idle_transaction_timeout`` for the claim's and the routines'
        connections; a handler's own open transaction waits for the
        server's global keepalive (docs/lifecycle.md#network-partitions)."""
        if self.dead_peer_seconds is None:
            return
        if remember(engine, Keepalive.within(self.dead_peer_seconds)):
            event.listen(engine, "connect", on_new_connections(engine, _keep_socket_alive))

    def routine_lock_holders(
        self, conn: Connection, *, keys: Mapping[int, str]
    ) -> list[LockHolder]:
        prefix = self._lock_prefix(conn)
        names = {f"n{at}": f"{prefix}m{key}" for at, key in enumerate(keys)}
        if not names:
            return []
        held = ", ".join(f"IS_USED_LOCK(:{name})" for name in names)
        sessions = conn.execute(text(f"SELECT {held}"), names).one()
        by_session = {
            int(session): routine
            for session, routine in zip(sessions, keys.values(), strict=True)
            if session is not None
        }
        if not by_session:
            return []
        rows = conn.execute(
            text(
                "SELECT ID, HOST, TIME, COMMAND FROM information_schema.PROCESSLIST "
                "WHERE ID IN :ids"
            ).bindparams(bindparam("ids", expanding=True)),
            {"ids": sorted(by_session)},
        ).all()
        seen = {int(row[0]): row for row in rows}
        holders = []
        for session, routine in sorted(by_session.items(), key=lambda item: item[1]):
            row = seen.get(session)
            holders.append(
                LockHolder(
                    routine=routine,
                    session=session,
                    worker=None,  # MariaDB's session list names no client
                    client=None if row is None else str(row[1]),
                    connected_at=None,
                    silent_seconds=None if row is None or row[3] != "Sleep" else float(row[2]),
                )
            )
        return holders

    def mark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        """A GET_LOCK named after the worker and the lane, held by the lane's
        working session: ``IS_USED_LOCK`` then tells another worker's rescue
        which server session to end (MariaDB cannot probe a silent peer per
        session: docs/lifecycle.md#network-partitions)."""
        name = self._session_name(conn, owner, slot)
        conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name})

    def unmark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        name = self._session_name(conn, owner, slot)
        conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})

    def end_sessions(self, conn: Connection, *, owners: Sequence[str]) -> int:
        names = {
            f"n{at}": self._session_name(conn, owner, slot)
            for at, (owner, slot) in enumerate(
                (owner, slot) for owner in owners for slot in range(SESSION_SLOTS)
            )
        }
        if not names:
            return 0
        held = ", ".join(f"IS_USED_LOCK(:{key})" for key in names)
        found = conn.execute(text(f"SELECT CONNECTION_ID(), {held}"), names).one()
        me, sessions = found[0], {int(i) for i in found[1:] if i is not None}
        ended = 0
        for session in sorted(sessions - {me}):
            try:
                conn.execute(text(f"KILL CONNECTION {int(session)}"))
                ended += 1
            except DBAPIError as exc:  # gone already, or not ours to end
                logger.warning("could not end session %d: %s", session, describe_error(exc))
        return ended

    def _session_name(self, conn: Connection, owner: str, slot: int) -> str:
        # GET_LOCK names are at most 64 characters: the owner as a digest
        digest = hashlib.blake2b(owner.encode(), digest_size=8).hexdigest()
        return f"{self._lock_prefix(conn)}w:{digest}:{int(slot)}"

    def end_when_idle(self, conn: Connection, seconds: float, *, local: bool = False) -> None:
        if local:
            return  # MySQL has no setting that ends with the transaction
        whole = max(1, int(seconds))
        conn.execute(text(f"SET SESSION wait_timeout = {whole}"))
        if getattr(conn.dialect, "is_mariadb", False):
            conn.execute(text(f"SET SESSION idle_transaction_timeout = {whole}"))

    def force_index(self, statement: Any, index: str) -> Any:
        """``FORCE INDEX``: InnoDB counts NULLs as one value
        (``innodb_stats_method = nulls_equal``), so beside a history whose
        ``id_inicial`` and ``live_id`` are mostly NULL it judged each IN
        value to match the whole table, and scanned it (100,000 rows read
        per purge chunk, tests/adapters/test_plans.py)."""
        hint = f"FORCE INDEX (`{index}`)"
        return statement.with_hint(self.table, hint, "mysql").with_hint(self.table, hint, "mariadb")

    def _prepare(self) -> None:
        super()._prepare()
        self._lock_prefixes: dict[str, str] = {}
        c = self.table.c
        self._select_ready = self._locking(
            select(self.table)
            .where(*self._ready())
            .order_by(*self._claim_order)
            .limit(inline_count())
        )
        self._mark_processing = (
            update(self.table)
            .where(self._id_in("ids"))
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("owner"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
        )
        self._lost = self._locking(self._lost)
        self._mine = self._locking(select(c.id).where(self._id_in("ids"), *self._claimed_by_owner))
        self._renew_ids = (
            update(self.table)
            .where(self._id_in("ids"))
            .values(lease_expires_at=self.lease_deadline())
        )
        # promotion in two steps: a locking read that skips rows another
        # transaction holds finds the due rows, then an UPDATE by primary key.
        # A single UPDATE ... WHERE status scans the status index under locks,
        # waits for any application transaction holding a due row, and
        # deadlocks with the claim's UPDATE, whose index entries it touches.
        self._due_ids = self._locking(
            select(c.id)
            .where(status_is(c.status, Status.SCHEDULED), c.data_hora <= self.now())
            .order_by(c.data_hora, c.id)
            .limit(inline_count())
        )
        self._promote_ids = (
            update(self.table)
            .where(self._id_in("ids"), status_is(c.status, Status.SCHEDULED))
            .values(status=Status.PENDING.value)
        )

    def _locking(self, statement: Any) -> Any:
        return statement.with_for_update(skip_locked=True) if self.skip_locked else statement

    def connect_claim(self, engine: Engine) -> Connection:
        # READ COMMITTED: the locking read takes no gap locks, so enqueuers
        # never wait for a claim
        conn = engine.connect().execution_options(isolation_level="READ COMMITTED")
        if self.task_locks:
            _keep_alive_while_idle(conn, self.dead_peer_seconds)
        return conn

    def connect_maintenance(self, engine: Engine) -> Connection:
        # READ COMMITTED: InnoDB then unlocks at once the rows a locking read
        # examined but did not return (the rescue's live tasks), so their
        # workers' completion does not wait for the rescue's transaction
        return self.connect_claim(engine)

    def now(self) -> ColumnElement[dt.datetime]:
        return func.utc_timestamp(6)

    def lease_deadline(self) -> ColumnElement[dt.datetime]:
        return func.timestampadd(
            literal_column("MICROSECOND"),
            bindparam("lease_us", type_=Integer),
            func.utc_timestamp(6),
        )

    def _lease_params(self, lease_seconds: float) -> dict[str, Any]:
        return {"lease_us": int(lease_seconds * 1_000_000)}

    def _lease_lost(self) -> ColumnElement[bool]:
        """Expired, or (with task locks) nobody holds the task's GET_LOCK.
        IS_USED_LOCK, not GET_LOCK: a rescue must not take the lock of a
        task whose worker is alive, even on its own connection."""
        c = self.table.c
        expired = c.lease_expires_at < self.now()
        if not self.task_locks:
            return or_(c.lease_expires_at.is_(None), expired)
        name = func.concat(bindparam("lock_prefix"), c.id)
        return or_(expired, func.is_used_lock(name).is_(None))

    def is_transient(self, exc: BaseException) -> bool:
        # 1213 deadlock, 1205 lock wait timeout: InnoDB rolled the statement
        # or the transaction back, and the same work can be tried again
        return _errno(exc) in (1205, 1213)

    def is_permanent(self, exc: BaseException) -> bool:
        # access denied (to the server, a database, a table), no such
        # database, no such table
        return _errno(exc) in (1044, 1045, 1049, 1142, 1146, 1698)

    def task_promote_due(self, conn: Connection) -> int:
        ids = conn.execute(self._due_ids, {"limit": PROMOTE_CHUNK}).scalars().all()
        if not ids:
            return 0
        return conn.execute(self._promote_ids, {"ids": list(ids)}).rowcount

    def task_lease_renew(
        self, conn: Connection, *, ids: Sequence[int], owner: str, lease_seconds: float
    ) -> int:
        if not ids:
            return 0
        # rows a transaction holds (a handler updating its own task) are
        # skipped, not waited for: the heartbeat serves every lane
        mine = conn.execute(self._mine, {"ids": list(ids), "owner": owner}).scalars().all()
        if not mine:
            return 0
        params = {"ids": list(mine), **self._lease_params(lease_seconds)}
        return conn.execute(self._renew_ids, params).rowcount

    def _lock_prefix(self, conn: Connection) -> str:
        """GET_LOCK names are server-wide: they hash the database and the
        table, so one queue table in two databases of a server (tenants)
        share no lock. Names are at most 64 characters."""
        database = self.table.schema or conn.engine.url.database or ""
        prefix = self._lock_prefixes.get(database)
        if prefix is None:
            if not database:
                database = conn.execute(select(func.database())).scalar() or ""
            digest = zlib.crc32(f"{database}.{self.table.name}".encode())
            prefix = self._lock_prefixes[database] = f"sqlaq:{digest:08x}:"
        return prefix

    def _get_locks(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Take the lock of each id without waiting; the ids obtained."""
        prefix = self._lock_prefix(conn)
        names = {f"n{i}": f"{prefix}{task_id}" for i, task_id in enumerate(ids)}
        sql = "SELECT " + ", ".join(f"GET_LOCK(:{key}, 0)" for key in names)
        got = conn.execute(text(sql), names).one()
        return [task_id for task_id, ok in zip(ids, got, strict=True) if ok == 1]

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        result = conn.execute(self._select_ready, {"limit": limit})
        keys = list(result.keys())
        rows = result.all()
        if not rows:
            return []
        locked = self._get_locks(conn, [row.id for row in rows]) if self.task_locks else []
        try:
            if self.task_locks:
                ours = set(locked)
                rows = [row for row in rows if row.id in ours]
            if rows:
                params = {
                    "ids": [row.id for row in rows],
                    "owner": owner,
                    **self._lease_params(lease_seconds),
                }
                conn.execute(self._mark_processing, params)
            return self._records(keys, rows, conn)
        except BaseException:
            # GET_LOCK is not transactional: give back what this failed claim took
            self.lock_release_many(conn, ids=locked)
            raise

    def lock_release_many(self, conn: Connection, *, ids: Sequence[int]) -> None:
        if not ids or not self.task_locks:
            return
        prefix = self._lock_prefix(conn)
        names = {f"n{i}": f"{prefix}{task_id}" for i, task_id in enumerate(ids)}
        sql = "SELECT " + ", ".join(f"RELEASE_LOCK(:{key})" for key in names)
        conn.execute(text(sql), names)

    def task_rescue_lost(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        params: dict[str, Any] = {"limit": limit}
        if self.task_locks:
            params["lock_prefix"] = self._lock_prefix(conn)
        ids = conn.execute(self._lost, params).scalars().all()
        if not ids:
            return []
        return self._fetch_records(conn, self._rows_by_id, {"ids": list(ids)})

    def lock_try(self, conn: Connection, *, key: int) -> bool:
        name = f"{self._lock_prefix(conn)}m{key}"
        return conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name}).scalar() == 1

    def lock_release(self, conn: Connection, *, key: int) -> None:
        name = f"{self._lock_prefix(conn)}m{key}"
        conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})


#: the longest wait_timeout the server takes (a year), set on the worker's
#: own connections: see _keep_alive_while_idle
_WAIT_TIMEOUT_MAX = 31_536_000
_SESSION_MARK = "sqla_queue_wait_timeout"
_IDLE_MARK = "sqla_queue_idle_transaction_timeout"


def _keep_socket_alive(keepalive: Keepalive, dbapi_connection: Any, record: Any) -> None:
    keep_socket_alive(getattr(dbapi_connection, "_sock", None), keepalive)


def _keep_alive_while_idle(conn: Connection, dead_peer_seconds: float | None = None) -> None:
    """A lane's claim connection is idle while its handlers run, and holds
    their per-task locks (GET_LOCK): a server whose ``wait_timeout`` ends it
    meanwhile frees them, and the rescue would take a healthy worker's
    tasks (docs/lifecycle.md, "Idle timeouts"). The session's own
    ``wait_timeout`` is raised to the largest the server takes, once per
    server session, and set back to the server's global value when the
    connection goes back to the pool."""
    record = conn.connection
    if record.info.get(_SESSION_MARK):
        return
    pool = conn.engine.pool
    if not event.contains(pool, "checkin", _reset_wait_timeout):
        event.listen(pool, "checkin", _reset_wait_timeout)
    with conn.begin():
        conn.execute(text(f"SET SESSION wait_timeout = {_WAIT_TIMEOUT_MAX}"))
        if dead_peer_seconds is not None and getattr(conn.dialect, "is_mariadb", False):
            # the claim's and the routines' transactions are short: one that
            # a cut-off worker left open (its row locks) ends within the bound
            whole = max(1, int(dead_peer_seconds))
            conn.execute(text(f"SET SESSION idle_transaction_timeout = {whole}"))
            record.info[_IDLE_MARK] = True
    record.info[_SESSION_MARK] = True


def _reset_wait_timeout(dbapi_connection: Any, record: Any) -> None:
    if not record.info.pop(_SESSION_MARK, False) or dbapi_connection is None:
        return
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION wait_timeout = @@GLOBAL.wait_timeout")
            if record.info.pop(_IDLE_MARK, False):
                cursor.execute(
                    "SET SESSION idle_transaction_timeout = @@GLOBAL.idle_transaction_timeout"
                )
    except Exception:  # a broken connection: the pool's own check will drop it
        record.invalidate()


def _errno(exc: BaseException) -> Any:
    args: tuple[Any, ...] = getattr(getattr(exc, "orig", exc), "args", ())
    return args[0] if args else None
