"""The routine lock: only one worker of a queue runs a routine at a time.

One small interface, :class:`RoutineLock`, so that the database locks here
and a lock server's (client-server mode) are interchangeable: the routines
never see which one they run under. Each adapter's ``routine_lock(engine)``
makes its database's (``sqla_queue.maintenance.lock.routine_lock_for`` is
the one place a worker asks for it, and where a lock server plugs in).

The database implementations are *session* locks that die with their
holder, on a connection of their own (so a worker that is killed frees its
routines at once), but one:

- PostgreSQL: ``pg_try_advisory_lock(<queue's maintenance namespace>, <routine key>)``;
  with per-task locks off (behind a transaction-pooling PgBouncer, where a
  session lock leaks to whichever client next gets its server session, and
  a lock held by an open transaction pins one of the pool's server
  connections) a *lease*, :class:`LeaseRoutineLock`: a row of the queue's
  configuration table, taken and given back in short transactions, which
  another worker takes over once it has expired by the database's clock
  (the dead-peer bound, or 60 s) when its holder died without giving it back;
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
server, at every slot. A lease is renewed the same way, every quarter of
its bound, and lapses when its holder stops renewing it.

Names are namespaced per queue table, so two queues never share a lock.
Should a lock ever be taken twice, the routines survive running on two
workers at once (each takes only rows no other transaction holds).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import secrets
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from sqlalchemy import Connection, Engine, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from ..common.redaction import describe_error
from ..schema.configuration_table import configuration_table_for, ensure_table, has_queue_name

if TYPE_CHECKING:
    from .base import Adapter

__all__ = [
    "DatabaseRoutineLock",
    "LeaseRoutineLock",
    "LocalRoutineLock",
    "RoutineLock",
    "SQLiteRoutineLock",
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
        for name in list(self._held):
            self.release(name)


class LeaseRoutineLock:
    """A lease per routine in a row of the queue's configuration table,
    taken, renewed and given back in short transactions of their own:
    holding it keeps no transaction and no session. PostgreSQL's lock with
    per-task locks off, the sign of a transaction-pooling PgBouncer, where
    a session lock leaks to the next client of its server session and a
    lock held by an open transaction pins one of the pool's few server
    connections while its routine runs on another (a pool of two deadlocked
    with two routines running).

    The row: ``setting_name`` ``routine_lock:<routine>`` and the queue's
    ``queue_name`` (on a table without that column the queue's name ends
    the setting name); ``value`` JSON, ``holder`` (the worker, for people),
    ``lease`` (a random token of this object: what holding means) and
    ``until`` (epoch seconds by the database's clock). Taken when missing
    (INSERT: a concurrent taker's unique violation is a refusal), free
    (released), expired by the database's clock or already this object's;
    taking a row read free is a compare-and-set on the value read, so two
    takers of one expired lease never both win. The bound is the adapter's
    ``dead_peer_seconds`` (60 s without one), renewed every quarter of it
    while held: a holder that dies or is cut off loses the lease within the
    bound, and one that comes back finds it gone at its next renewal."""

    #: the scheduler gives the lock back after each run (scheduler.py): a
    #: worker killed between runs holds nothing, not a lease for the bound
    held_between_runs = False

    def __init__(self, engine: Engine, adapter: Adapter, settings: Table | None = None) -> None:
        """``settings``: the configuration table holding the rows (default:
        the queue model's, ``configuration_table_for`` in
        ``sqla_queue.schema.configuration_table``)."""
        self.engine = engine
        self.adapter = adapter
        self.settings = configuration_table_for(adapter.table) if settings is None else settings
        self.queue = adapter.table.name
        bound = adapter.dead_peer_seconds
        #: how long a lease lasts unrenewed
        self.lease_seconds = DEFAULT_LEASE_SECONDS if bound is None else float(bound)
        self.token = secrets.token_hex(8)
        self.owner: str | None = None
        self._ours = f'"lease":"{self.token}"'
        self._held: set[str] = set()
        self._mutex = threading.Lock()
        self._scoped: bool | None = None
        self._failing = False
        self._renewals = _Pings(
            f"sqla-queue-lease-{id(self):x}", self.lease_seconds / 4, self._renew
        )

    # ------------------------------------------------------------ the protocol
    def try_acquire(self, name: str) -> bool:
        try:
            got = self._take(name)
        except IntegrityError:  # another worker inserted the row first
            got = False
        except Exception as exc:
            if self.adapter.is_transient(exc):  # lock_timeout: another is writing the row
                logger.debug("routine lock %s: %s", name, describe_error(exc))
            else:  # the database is away: nobody runs it now; once per outage
                log = logger.debug if self._failing else logger.warning
                log("routine lock %s: %s", name, describe_error(exc))
                self._failing = True
            got = False
        else:
            self._failing = False
        with self._mutex:
            if got:
                self._held.add(name)
            else:  # a lease this object may still have lapses within the bound
                self._held.discard(name)
        if got:
            self._renewals.start()
        return got

    def release(self, name: str) -> None:
        with self._mutex:
            if name not in self._held:
                return
            self._held.discard(name)
        try:
            with self._transaction() as conn:
                conn.execute(
                    update(self.settings)
                    .where(*self._where(name), self._held_here())
                    .values(value=_FREE)
                )
        except Exception as exc:  # the lease lapses within the bound anyway
            logger.debug("routine lock %s release: %s", name, describe_error(exc))

    def close(self) -> None:
        self._renewals.stop()
        for name in list(self._held):
            self.release(name)

    # ------------------------------------------------------------ the row
    def _take(self, name: str) -> bool:
        scoped = self._ready()
        c = self.settings.c
        where = self._where(name)
        with self._transaction() as conn:
            found = select(c.value).where(*where)
            now, value, exists = conn.execute(
                select(self.adapter.clock(), found.scalar_subquery(), found.exists())
            ).one()
            now = _epoch(now)
            lease, until = _lease_of(value)
            if exists and lease is not None and lease != self.token and until > now:
                return False  # another holder's live lease
            written = self._value(now)
            if exists and lease == self.token:  # ours: renewed (the renewals may write it too)
                renewed = conn.execute(
                    update(self.settings).where(*where, self._held_here()).values(value=written)
                )
                return renewed.rowcount == 1
            if not exists:
                row = {
                    "setting_name": self._row_name(name),
                    "value": written,
                    "unit": None,
                    "casted_as": "JSON",
                    "note": f"routine lock lease of {self.queue} (sqla-queue)",
                }
                if scoped:
                    row["queue_name"] = self.queue
                conn.execute(insert(self.settings).values(**row))
                return True
            # compare-and-set on the value read: another taker of the same
            # free or expired lease changed it, and the row lock made this
            # update wait for that commit, then match nothing
            same = c.value.is_(None) if value is None else c.value == value
            taken = conn.execute(update(self.settings).where(*where, same).values(value=written))
            return taken.rowcount == 1

    def _renew(self) -> None:
        """Each held lease pushed to a bound from now; one taken over (it
        expired: this process was away) is lost."""
        with self._mutex:
            names = sorted(self._held)
        if not names:
            return
        lost = []
        try:
            with self._transaction() as conn:
                written = self._value(
                    _epoch(conn.execute(select(self.adapter.clock())).scalar_one())
                )
                for name in names:
                    renewed = conn.execute(
                        update(self.settings)
                        .where(*self._where(name), self._held_here())
                        .values(value=written)
                    )
                    if renewed.rowcount != 1:
                        lost.append(name)
        except Exception as exc:  # the next renewal, or try_acquire, tries again
            logger.warning(
                "routine locks %s not renewed: %s", ", ".join(names), describe_error(exc)
            )
            return
        for name in lost:
            with self._mutex:
                if name not in self._held:
                    continue  # released meanwhile
                self._held.discard(name)
            logger.warning("routine lock %s lost: its lease expired and was taken over", name)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A short transaction, which waits at most ``LEASE_WAIT_MS`` for a
        row another one is writing, and which the server ends if its client
        leaves it idle for the bound (cut off between two statements)."""
        with self.engine.connect() as conn, conn.begin():
            conn.execute(
                _LEASE_TRANSACTION,
                {"wait": str(LEASE_WAIT_MS), "idle": str(int(self.lease_seconds * 1000))},
            )
            yield conn

    def _ready(self) -> bool:
        """Whether the table has ``queue_name``; the table made first if
        missing (DDL, before the lease's transaction)."""
        if self._scoped is None:
            ensure_table(self.engine, self.settings)
            with self.engine.connect() as conn:
                self._scoped = has_queue_name(conn, self.settings)
        return self._scoped

    def _row_name(self, name: str) -> str:
        if self._scoped:
            return f"{LEASE_PREFIX}{name}"
        return f"{LEASE_PREFIX}{name}:{self.queue}"  # a table shared by the schema's queues

    def _where(self, name: str) -> list[ColumnElement[bool]]:
        c = self.settings.c
        where = [c.setting_name == self._row_name(name)]
        if self._scoped:
            where.append(c.queue_name == self.queue)
        return where

    def _held_here(self) -> ColumnElement[bool]:
        """The row's lease is this object's (the value is written here alone)."""
        return self.settings.c.value.contains(self._ours, autoescape=True)

    def _value(self, now: float) -> str:
        until = round(now + self.lease_seconds, 3)
        return json.dumps(
            {"holder": self.owner, "lease": self.token, "until": until}, separators=(",", ":")
        )


#: a routine lease row's setting_name, before the routine's name
LEASE_PREFIX = "routine_lock:"
#: a lease without a dead-peer bound lasts this long unrenewed
DEFAULT_LEASE_SECONDS = 60.0
#: the longest a lease's transaction waits for a row another one writes
LEASE_WAIT_MS = 1000
#: the value of a released lease
_FREE = json.dumps({"holder": None, "lease": None, "until": 0}, separators=(",", ":"))
#: the lease transaction's own settings (set_config(..., true): they end
#: with it, and reach no other client of a pooler)
_LEASE_TRANSACTION = text(
    "SELECT set_config('lock_timeout', :wait, true),"
    " set_config('idle_in_transaction_session_timeout', :idle, true)"
)


def _epoch(when: dt.datetime) -> float:
    """A database time as epoch seconds (a naive one is UTC)."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _lease_of(value: str | None) -> tuple[str | None, float]:
    """(lease token, until) of a row's value; no token when released, or
    unreadable (edited by hand): free."""
    try:
        data = json.loads(value or "")
        lease = data.get("lease")
        return (str(lease) if lease else None), float(data.get("until") or 0)
    except (ValueError, TypeError, AttributeError):
        return None, 0.0


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
