"""The routine lock: only one worker of a queue runs a routine at a time.

One small interface, :class:`RoutineLock`, so that the database locks here
and a lock server's (client-server mode) are interchangeable: the routines
never see which one they run under. Each adapter's ``routine_lock(engine)``
makes its database's (``sqla_queue.maintenance.lock.routine_lock_for`` is
the one place a worker asks for it, and where a lock server plugs in).

The database implementations are *session* locks that die with their
holder, on a connection of their own (so a worker that is killed frees its
routines at once):

- PostgreSQL: ``pg_try_advisory_lock(<queue's maintenance namespace>, <routine key>)``;
  with per-task locks off (behind a transaction-pooling PgBouncer, where a
  session lock leaks to whichever client next gets its server session),
  ``pg_try_advisory_xact_lock`` in a transaction kept open while it is held;
- MySQL, MariaDB: ``GET_LOCK('sqlaq:<hash of database and table>:m<routine key>', 0)``;
- SQLite: the write lock (``BEGIN IMMEDIATE``) of a small lock file beside
  the database, one per queue table and routine: held, it blocks no writer
  of the queue, and the operating system frees it with the process.
  An in-memory database has a single process: an in-process lock serves.

With a dead-peer bound (``dead_peer_seconds``: liveness.py) a database
lock's connection is one the server ends once idle for the bound
(``end_when_idle``), and the holder pings it every quarter of the bound: a
holder cut off by the network stops pinging, and the server frees its locks
within the bound whatever TCP keepalive says. A holder that comes back finds
its connection gone: a lock is held only while the ping (or the try that
took it) reaches the server, and the scheduler takes it again, on the
server, at every slot.

Names are namespaced per queue table, so two queues never share a lock.
Should a lock ever be taken twice, the routines survive running on two
workers at once (each takes only rows no other transaction holds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from sqlalchemy import Connection, Engine, select

from ..redaction import describe_error

if TYPE_CHECKING:
    from .base import Adapter

__all__ = [
    "DatabaseRoutineLock",
    "LocalRoutineLock",
    "RoutineLock",
    "SQLiteRoutineLock",
    "TransactionRoutineLock",
    "routine_key",
]

logger = logging.getLogger("sqla_queue.maintenance")


@runtime_checkable
class RoutineLock(Protocol):
    def try_acquire(self, name: str) -> bool:
        """Take the lock ``name`` without waiting; whether it was taken."""
        ...

    def release(self, name: str) -> None:
        """Give back ``name`` (taken by this object); nothing if not held."""
        ...


#: what a lock's session is called, before the worker's id (application_name)
SESSION_NAME = "sqla-queue "


def routine_key(name: str) -> int:
    """A routine's lock key: a signed 32-bit number stable across processes."""
    value = zlib.crc32(f"sqla_queue:routine:{name}".encode())
    return value - (1 << 32) if value >= (1 << 31) else value


class _Pings:
    """A thread that calls ``ping`` every ``interval`` seconds until
    :meth:`stop`: keeps a lock's connection from ending idle."""

    def __init__(self, name: str, interval: float, ping: Callable[[], None]) -> None:
        self.name = name
        self.interval = interval
        self.ping = ping
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ping()
            except Exception as exc:  # a bug of ours: the next ping tries again
                logger.warning("%s: %s", self.name, describe_error(exc))


def _pings(owner: Any, adapter: Adapter, ping: Callable[[], None]) -> _Pings | None:
    """The pings of a lock whose adapter has a dead-peer bound."""
    bound = adapter.dead_peer_seconds
    if bound is None:
        return None
    return _Pings(f"sqla-queue-lock-ping-{id(owner):x}", bound / 4, ping)


class DatabaseRoutineLock:
    """Advisory locks / GET_LOCK, held on one connection of their own, kept
    for the worker's life (taken from the pool once, not at every slot)."""

    def __init__(self, engine: Engine, adapter: Adapter) -> None:
        self.engine = engine
        self.adapter = adapter
        self._conn: Connection | None = None
        self._held: set[str] = set()
        self._mutex = threading.Lock()
        self._failing = False
        self._pings = _pings(self, adapter, self._ping)
        #: the worker holding the locks, shown in the server's session list
        #: (``sqla-queue status`` reads it there)
        self.owner: str | None = None

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            self._held.clear()  # whatever the old connection held died with it
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._conn = conn
            bound = self.adapter.dead_peer_seconds
            with conn.begin():
                if self.owner is not None:
                    self.adapter.name_session(conn, f"{SESSION_NAME}{self.owner}")
                if bound is not None:
                    self.adapter.end_when_idle(conn, bound)
            if self._pings is not None:
                self._pings.start()
        return self._conn

    def _ping(self) -> None:
        with self._mutex:
            conn = self._conn
            if conn is None:
                return
            try:
                with conn.begin():
                    conn.execute(select(1))
            except Exception as exc:  # the server ended the session: its locks are gone
                if self._held:
                    names = ", ".join(sorted(self._held))
                    logger.warning("routine locks %s lost: %s", names, describe_error(exc))
                self._drop()

    def try_acquire(self, name: str) -> bool:
        with self._mutex:
            if name in self._held:
                return True
            try:
                conn = self._connection()
                with conn.begin():
                    got = self.adapter.lock_try(conn, key=routine_key(name))
            except Exception as exc:  # the database is away: nobody runs it now
                # once per outage, not once a second
                log = logger.debug if self._failing else logger.warning
                log("routine lock %s: %s", name, describe_error(exc))
                self._failing = True
                self._drop()
                return False
            self._failing = False
            if got:
                self._held.add(name)
            return got

    def release(self, name: str) -> None:
        with self._mutex:
            if name not in self._held:
                return
            self._held.discard(name)
            conn = self._conn
            if conn is None:
                return
            try:
                with conn.begin():
                    self.adapter.lock_release(conn, key=routine_key(name))
            except Exception as exc:  # the connection died, and the lock with it
                logger.debug("routine lock %s release: %s", name, describe_error(exc))
                self._drop()

    def close(self) -> None:
        """Give everything back: each lock explicitly (the server frees a
        closed connection's locks a moment later, not at once), then the
        connection, for good: not to the pool, where a lock that could not
        be released would outlive us."""
        if self._pings is not None:
            self._pings.stop()
        for name in list(self._held):
            self.release(name)
        with self._mutex:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._held.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
                conn.close()


class _TransactionPerLock:
    """A lock per name, held by a transaction left open on a connection of
    its own, and freed by ending it. Subclasses open and begin it."""

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}
        self._mutex = threading.Lock()
        self._pings: _Pings | None = None

    def _ping(self) -> None:
        """Each held lock's transaction, kept from ending idle; a lock whose
        session the server ended is dropped."""
        with self._mutex:
            held = list(self._held.items())
        for name, conn in held:
            try:
                conn.execute(select(1))
            except Exception as exc:
                logger.warning("routine lock %s lost: %s", name, describe_error(exc))
                with self._mutex:
                    if self._held.get(name) is conn:
                        del self._held[name]
                with contextlib.suppress(Exception):
                    conn.invalidate()

    def _open(self, name: str) -> Any:
        """A connection holding ``name``'s lock in its open transaction, or
        None when someone else holds it."""
        raise NotImplementedError

    def try_acquire(self, name: str) -> bool:
        with self._mutex:
            if name in self._held:
                return True
        conn = self._open(name)
        if conn is None:
            return False
        with self._mutex:
            self._held[name] = conn
        return True

    def release(self, name: str) -> None:
        with self._mutex:
            conn = self._held.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.rollback()
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        if self._pings is not None:
            self._pings.stop()
        for name in list(self._held):
            self.release(name)


class TransactionRoutineLock(_TransactionPerLock):
    """PostgreSQL advisory locks held by an open transaction, one connection
    per lock: behind a transaction-pooling PgBouncer an open transaction
    keeps its server session, and ending it frees the lock wherever it is.
    The holding connection is idle in transaction between runs; it takes no
    snapshot, so it holds back no vacuum."""

    def __init__(self, engine: Engine, adapter: Adapter) -> None:
        super().__init__()
        self.engine = engine
        self.adapter = adapter
        self._pings = _pings(self, adapter, self._ping)
        self.owner: str | None = None

    def _open(self, name: str) -> Any:
        conn = None
        try:
            conn = self.engine.connect()
            conn.begin()
            postgres: Any = self.adapter  # PostgresAdapter, by routine_lock_for
            if postgres.lock_try_transaction(conn, key=routine_key(name)):
                if self.owner is not None:
                    self.adapter.name_session(conn, f"{SESSION_NAME}{self.owner}", local=True)
                bound = self.adapter.dead_peer_seconds
                if bound is not None and self._pings is not None:
                    # SET LOCAL: behind PgBouncer a session setting would
                    # outlive the transaction, on another client's session
                    self.adapter.end_when_idle(conn, bound, local=True)
                    self._pings.start()
                return conn
        except Exception as exc:  # the database is away: nobody runs it now
            logger.debug("routine lock %s: %s", name, describe_error(exc))
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        return None


class SQLiteRoutineLock(_TransactionPerLock):
    """SQLite's write lock on a lock file per queue table and routine."""

    def __init__(self, database: str, qualified_table: str) -> None:
        super().__init__()
        self.database = database
        self.qualified_table = qualified_table

    def path(self, name: str) -> Path:
        digest = zlib.crc32(f"{self.qualified_table}:{name}".encode())
        return Path(f"{self.database}-sqlaq-{digest:08x}.lock")

    def _open(self, name: str) -> Any:
        import sqlite3  # only where the queue is on SQLite, not in every worker

        conn = None
        try:
            conn = sqlite3.connect(
                self.path(name), timeout=0, isolation_level=None, check_same_thread=False
            )
            conn.execute("BEGIN IMMEDIATE")
            return conn
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            if "locked" not in str(exc):
                logger.warning("routine lock %s: %s", name, exc)
            return None


class LocalRoutineLock:
    """Exclusive within this process only (an in-memory SQLite database)."""

    _registry: ClassVar[dict[str, threading.Lock]] = {}
    _registry_mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self._held: set[str] = set()

    def _lock(self, name: str) -> threading.Lock:
        with self._registry_mutex:
            return self._registry.setdefault(f"{self.namespace}:{name}", threading.Lock())

    def try_acquire(self, name: str) -> bool:
        if name in self._held:
            return True
        if self._lock(name).acquire(blocking=False):
            self._held.add(name)
            return True
        return False

    def release(self, name: str) -> None:
        if name in self._held:
            self._held.discard(name)
            self._lock(name).release()

    def close(self) -> None:
        for name in list(self._held):
            self.release(name)
