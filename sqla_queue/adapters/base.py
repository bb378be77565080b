"""The adapter contract: one method per database operation.

An adapter knows SQL and its dialect, never what a retry or a dead letter
is: the manager decides, the adapter executes. Portable statements are
SQLAlchemy Core here; each dialect module overrides what its database does
differently (claims, locks, wake-ups). An operation a database cannot do
raises :class:`UnsupportedOperationError`; it never silently does nothing.

Transactions: operations on the claim connection are called inside the
manager's ``with conn.begin()`` (free on PostgreSQL, whose claim connection
is in autocommit); operations on the work connection run in the caller's
transaction. Adapters never begin or commit.

Connections: a worker lane holds two. The *claim connection* claims tasks
and owns the per-task locks (they die with it, so a dead worker's tasks are
visible to the rescue); the *work connection* carries the handlers'
transaction and the status updates that commit with them.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import enum
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    exists,
    false,
    func,
    insert,
    inspect,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError
from sqlalchemy.sql.elements import ColumnElement

from ..common.exceptions import UnsupportedOperationError
from ..common.identifiers import lock_namespace
from ..common.types import UtcDateTime, utcnow
from ..schema.mixins import OWN_COLUMNS, Status, equivalence_criteria, inline_count, status_is
from ..schema.records import TaskRecord
from ..schema.rows import SUCCESS_MESSAGE
from .actions import ActionQueries
from .archive import ArchiveQueries
from .configuration import SettingRows
from .fairness import FairnessQueries
from .inspection import InspectionQueries
from .limits import LimitQueries
from .maintenance import MaintenanceQueries
from .sqla_private import echo_on, events_flagged, invalidate_pooled
from .unique import UniqueQueries, duplicate_error, refused_by_live_index
from .workflow import WorkflowQueries
from .workflow_purge import WorkflowPurgeQueries
from .workflow_view import WorkflowViewQueries

__all__ = ["Adapter", "ClaimFilter", "HorizonHolder", "Listener", "LockHolder", "VacuumState"]

_Part = TypeVar("_Part")

PROMOTE_CHUNK = 1000  # due rows made 'pendente' per statement
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


#: ids per IN list on the databases that take them one parameter each
IN_LIST_MAX = 100


class ErrorKind(enum.Enum):
    """What a database error means for the worker (``Adapter.classify``)."""

    #: the database asks for the transaction to be tried again (a deadlock,
    #: a lock timeout, a serialisation failure, SQLite's busy write lock)
    TRANSIENT = "transient"
    #: waiting cannot help: a refused login, a missing database or table
    PERMANENT = "permanent"
    #: the connection is gone or was refused: reconnect and carry on
    DISCONNECT = "disconnect"
    #: anything else (a statement's own error)
    OTHER = "other"


#: the key a fair claim takes tasks of now (sqla_queue.policies.fairness): read by
#: the claim statements of a ClaimFilter with ``fair_column`` as they run
FAIR_KEY: contextvars.ContextVar[Any] = contextvars.ContextVar("sqla_queue_fair_key")


@dataclass(frozen=True)
class ClaimFilter:
    """Which ready rows a worker's claim may take (the runner decides, the
    adapter compiles it into its claim statements once).

    ``processes``: only rows whose ``processo`` is one of these (None: any).
    ``subscriber_ids``: None for a plain filter; a set (maybe empty) makes
    it a pub/sub filter: rows with ``pub_sub`` true (of ``processes``, when
    given) or whose ``subscriber_id`` is one of these, and nothing else.
    ``all_subscribers``: a pub/sub filter that takes the copies of every
    subscription (of ``processes``, when given): the webhook worker's."""

    processes: frozenset[str] | None = None
    subscriber_ids: frozenset[str] | None = None
    all_subscribers: bool = False
    #: a row is ready only this many seconds after its time (PEQ's item_delay)
    delay_seconds: float = 0.0
    #: processes paused across the fleet (sqla_queue.client.pause): never claimed
    paused: frozenset[str] = frozenset()
    #: per-key fairness (sqla_queue.policies.fairness): only rows whose column
    #: ``fair_column`` holds the key in :data:`FAIR_KEY` when the statement
    #: runs (``fair_null``: only rows where it is NULL)
    fair_column: str | None = None
    fair_null: bool = False

    def predicate(self, table: Table) -> ColumnElement[bool] | None:
        """The WHERE condition, or None when every row qualifies."""
        routed = self._routed(table)
        if self.fair_column is not None:
            column = table.c[self.fair_column]
            keyed = (
                column.is_(None)
                if self.fair_null
                else column == bindparam("fair_key", callable_=FAIR_KEY.get, type_=column.type)
            )
            routed = keyed if routed is None else and_(routed, keyed)
        if self.paused:
            c = table.c
            running = or_(c.processo.is_(None), c.processo.not_in(sorted(self.paused)))
            routed = running if routed is None else and_(routed, running)
        if not self.delay_seconds:
            return routed
        delay = dt.timedelta(seconds=self.delay_seconds)
        delayed = table.c.data_hora <= bindparam(
            "ready_before", callable_=lambda: utcnow() - delay, type_=UtcDateTime()
        )
        return delayed if routed is None else and_(routed, delayed)

    def _routed(self, table: Table) -> ColumnElement[bool] | None:
        c = table.c
        by_process = None if self.processes is None else c.processo.in_(sorted(self.processes))
        if self.subscriber_ids is None and not self.all_subscribers:
            return by_process
        publications = c.pub_sub == true()
        if by_process is not None:
            publications = and_(publications, by_process)
        if self.all_subscribers:
            copies: ColumnElement[bool] = c.subscriber_id.is_not(None)
            if by_process is not None:
                copies = and_(copies, by_process)
            return or_(publications, copies)
        if not self.subscriber_ids:
            return publications
        return or_(publications, c.subscriber_id.in_(sorted(self.subscriber_ids)))


@dataclass(frozen=True)
class HorizonHolder:
    """Something that keeps a vacuum from freeing the dead tuples newer than
    it: a transaction (its snapshot or its transaction id), a prepared
    transaction, a replication slot, a standby's feedback."""

    #: one line naming it (pid, state and application; slot; gid; standby),
    #: never its query text
    what: str
    #: the same across rounds while the same transaction, slot or standby
    #: holds (the routine warns once per pin)
    pin: str
    #: transactions begun since its oldest one (``age()``: wraparound-safe)
    xids: int
    #: seconds it has held (its transaction's start, its PREPARE); None where
    #: the database does not say (slots, standbys)
    seconds: float | None = None


@dataclass(frozen=True)
class VacuumState:
    """What the vacuum routine needs to know of a queue table."""

    dead_tuples: int
    #: the next transaction id, 64 bits wide (it never wraps): what the
    #: routine notes each round to age the holders that carry no time
    next_xid: int = 0
    #: the holders of the horizon, oldest first: transactions held longer
    #: than the routine's ``horizon_seconds``, and every slot and standby
    holders: tuple[HorizonHolder, ...] = ()


@dataclass(frozen=True)
class TableHealth:
    """A queue table's storage as the database counts it (PostgreSQL)."""

    table_bytes: int
    index_bytes: int
    dead_tuples: int
    live_tuples: int
    #: how long the transaction holding the oldest snapshot of the database
    #: has run (seconds; None: no other transaction holds one)
    horizon_seconds: float | None
    #: that transaction, on one line (its pid, state, application; never its
    #: query text); None when there is none
    horizon_holder: str | None
    #: replication slots and prepared transactions that hold the horizon
    #: (they have no start time), one line each
    horizon_others: tuple[str, ...] = ()


class Wake(Protocol):
    """What a listener calls when work may have arrived: a worker's lane
    wake-up (``worker/wakeup.py``) or a ``threading.Event``."""

    def set(self) -> None: ...


class Listener:
    """Wakes idle lanes when the database says work arrived."""

    def start(self, wake: Wake) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


# Events that see or replace statement execution (tracing, query logging,
# error translation): with any of them listening, statements go through
# SQLAlchemy's execute so they see them.
_CONNECTION_EVENTS = (
    "before_execute",
    "after_execute",
    "before_cursor_execute",
    "after_cursor_execute",
)
_DIALECT_EVENTS = (
    "handle_error",
    "do_execute",
    "do_execute_no_params",
    "do_executemany",
    "do_setinputsizes",
)


class _DirectInsert(NamedTuple):
    """One INSERT compiled by SQLAlchemy for a dialect, run on the driver's cursor."""

    sql: str
    order: tuple[str, ...] | None  # parameter order for positional paramstyles
    defaults: Mapping[str, Any]  # scalar Python-side column defaults
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]  # the columns' bind processors
    returning: bool  # INSERT ... RETURNING id, else cursor.lastrowid


def statements_unobserved(conn: Connection) -> bool:
    """Whether statements may run on ``conn``'s DBAPI cursor unnoticed: a
    live transaction (savepoint included) that ``conn.execute`` would use
    as is, no echo, no statement or dialect event listener, no schema
    translation. Otherwise they go through ``conn.execute``, which also
    autobegins and refuses a transaction that must be rolled back first."""
    nested = conn.get_nested_transaction()
    if not conn.in_transaction() or (nested is not None and not nested.is_active):
        return False
    if echo_on(conn) or conn.get_execution_options().get("schema_translate_map"):
        return False
    # SQLAlchemy's own "anything listening at all" flags first (set by any
    # connection or dialect event listener): on every enqueue's path
    if not events_flagged(conn):
        return True
    return not (
        any(getattr(conn.dispatch, name, None) for name in _CONNECTION_EVENTS)
        or any(_foreign(getattr(conn.dialect.dispatch, name, None)) for name in _DIALECT_EVENTS)
    )


def _foreign(listeners: Any) -> bool:
    """Whether ``listeners`` hold one that is not sqla-queue's own
    ``handle_error`` (the live-key index's error, which DriverErrors gives
    on the direct path too)."""
    return bool(listeners) and any(fn is not refused_by_live_index for fn in listeners)


class DriverErrors:
    """``with DriverErrors(conn, statement, params) as dbapi_connection:``
    runs driver calls on ``conn``'s DBAPI connection with ``conn.execute``'s
    error handling: a DBAPI error comes out as SQLAlchemy's ``DBAPIError``
    subclass, and a lost connection is invalidated, with the pool's older
    connections, as SQLAlchemy does. ``insert_task`` takes this path only
    where :func:`statements_unobserved`; ``copy_tasks`` always (SQLAlchemy
    has no COPY), after a ``conn.execute`` that begins the transaction.
    A class, not a generator: it is on every enqueue's path."""

    __slots__ = ("conn", "dbapi_connection", "params", "statement")

    def __init__(self, conn: Connection, statement: str, params: Any = None) -> None:
        self.conn = conn
        self.statement = statement
        self.params = params
        self.dbapi_connection: Any = None

    def __enter__(self) -> Any:
        self.dbapi_connection = self.conn.connection.dbapi_connection
        assert self.dbapi_connection is not None
        return self.dbapi_connection

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        if exc is None:
            return
        conn = self.conn
        dialect = conn.dialect
        if isinstance(exc, dialect.loaded_dbapi.Error):
            invalidated = dialect.is_disconnect(exc, self.dbapi_connection, None)
            error: StatementError = DBAPIError.instance(
                self.statement,
                self.params,
                exc,
                dialect.loaded_dbapi.Error,
                hide_parameters=conn.engine.hide_parameters,
                connection_invalidated=invalidated,
                dialect=dialect,
            )
            if invalidated:
                invalidate_pooled(conn, exc)  # as conn.execute does
                conn.invalidate(exc)
            raise (duplicate_error(error) or error) from exc
        if not isinstance(exc, (Exception, GeneratorExit)):
            # KeyboardInterrupt, SystemExit, a cancelled greenlet: the
            # protocol may be mid-message, so the connection is not reused
            conn.invalidate(exc)


@contextlib.contextmanager
def driver_cursor(conn: Connection, statement: str, params: Any = None) -> Iterator[Any]:
    """A cursor of ``conn``'s DBAPI connection, with :class:`DriverErrors`'
    error handling; closed on the way out."""
    with DriverErrors(conn, statement, params) as dbapi_connection:
        cursor = dbapi_connection.cursor()
        try:
            yield cursor
        finally:
            _close_quietly(cursor)


def _close_quietly(cursor: Any) -> None:
    if cursor is not None:
        with contextlib.suppress(Exception):
            cursor.close()


@dataclass(frozen=True)
class LockHolder:
    """A routine lock's holder as the database sees it: the routine, the
    server session holding it, the worker (where the session names it), the
    client's address, when the session began and how long it has been
    silent (a holder cut off by the network stops pinging)."""

    routine: str
    session: int
    worker: str | None
    client: str | None
    connected_at: dt.datetime | None
    silent_seconds: float | None


class Adapter:
    """Database operations on one queue table (portable defaults)."""

    family: ClassVar[str] = "generic"
    #: SELECT ... FOR UPDATE SKIP LOCKED (a routine leaves a claim's rows alone)
    skip_locked: ClassVar[bool] = False
    #: why a worker needs the queue server here (no lock that dies with a
    #: connection, no NOTIFY); empty: it does not
    needs_queue_server: ClassVar[str] = ""
    #: the claim connection runs in autocommit (one statement, one round trip)
    claim_autocommit: ClassVar[bool] = False
    supports_notify: ClassVar[bool] = False
    supports_task_locks: ClassVar[bool] = False
    #: one writer at a time (SQLite): a transaction that has written holds
    #: every other writer off until it ends
    single_writer: ClassVar[bool] = False
    #: the vacuum routine has something to do (table_vacuum_state, table_vacuum)
    supports_vacuum: ClassVar[bool] = False

    def __init__(
        self,
        table: Table,
        channel: str,
        *,
        task_locks: bool = True,
        claim_filter: ClaimFilter | None = None,
        in_caller_transaction: bool = False,
        dead_peer_seconds: float | None = None,
    ) -> None:
        #: seconds after which a worker cut off by the network holds nothing
        #: (liveness.py); None: the database's and the system's defaults
        self.dead_peer_seconds = dead_peer_seconds
        #: the statements run in a transaction of the caller's that began
        #: before its tasks were enqueued (sqla_queue.testing): "now" must be
        #: the statement's time, not the transaction's start
        self.in_caller_transaction = in_caller_transaction
        self.table = table
        self.channel = channel
        self.claim_filter = claim_filter
        #: take a per-task lock at claim time, where the database has one that
        #: dies with the connection (off behind a transaction-pooling proxy)
        self.task_locks = task_locks and self.supports_task_locks
        qualified = f"{table.schema}.{table.name}" if table.schema else table.name
        self.qualified_name = qualified
        self.task_lock_namespace = lock_namespace(qualified, "task")
        self.maintenance_lock_namespace = lock_namespace(qualified, "maintenance")
        c = table.c
        self._claim_order = (c.prioridade.desc(), c.data_hora, c.id)
        self._insert_returning = insert(table).returning(c.id, sort_by_parameter_order=True)
        claimed = (status_is(c.status, Status.PROCESSING), c.worker_id == bindparam("owner"))
        self._claimed_by_owner = claimed
        # completion and hand-back are guarded by the claim: a row that is no
        # longer 'processando' for this worker (rescued, taken over) is not
        # touched, and the caller learns it from the row count
        self._complete = (
            update(table)
            .where(self._id_in("ids"), *claimed)
            .values(
                status=Status.SUCCEEDED.value, mensagem=SUCCESS_MESSAGE, finished_at=self.clock()
            )
        )
        self._complete_custom = (
            update(table).where(c.id == bindparam("b_id")).values(mensagem=bindparam("b_message"))
        )
        #: one task (a batch of one: transaction_per_task, slow or I/O-bound
        #: handlers): one primary-key statement with its message
        self._complete_one = (
            update(table)
            .where(c.id == bindparam("b_id"), *claimed)
            .values(
                status=Status.SUCCEEDED.value,
                mensagem=bindparam("b_message"),
                finished_at=self.clock(),
            )
        )
        self._hand_back = (
            update(table)
            .where(self._id_in("ids"), *claimed)
            .values(
                status=Status.PENDING.value, worker_id=None, lease_expires_at=None, started_at=None
            )
        )
        self._renew = (
            update(table)
            .where(self._id_in("ids"), *claimed)
            .values(lease_expires_at=self.lease_deadline())
        )
        self._promote = (
            update(table)
            .where(
                c.id.in_(
                    select(c.id)
                    .where(status_is(c.status, Status.SCHEDULED), c.data_hora <= self.now())
                    .limit(PROMOTE_CHUNK)
                    .scalar_subquery()
                ),
                status_is(c.status, Status.SCHEDULED),
            )
            .values(status=Status.PENDING.value)
        )
        self._lost = (
            select(c.id)
            .where(status_is(c.status, Status.PROCESSING), self._lease_lost())
            .order_by(c.id)
            .limit(inline_count())
        )
        self._next_due = select(func.min(c.data_hora)).where(status_is(c.status, Status.SCHEDULED))
        self._payloads = select(c.id, c.payload).where(self._id_in("ids"))
        self._rows_by_id = select(self.table).where(self._id_in("ids"))
        self._null_by_default = frozenset(
            column.name
            for column in c
            if column.nullable and column.default is None and column.server_default is None
        )
        self._direct_inserts: dict[tuple[Any, ...], _DirectInsert | None] = {}
        self._prepare()

    def _prepare(self) -> None:
        """Compile the dialect's own statements, once; subclasses extend it
        (calling super) instead of repeating the constructor."""

    # ------------------------------------------------------------ parts
    # the parts below are built on first use, once per adapter; callers
    # never build them themselves
    @functools.cached_property
    def inspection(self) -> InspectionQueries:
        """The operator's view: counts, timelines (``adapters/inspection.py``)."""
        return InspectionQueries(self)

    @functools.cached_property
    def actions(self) -> ActionQueries:
        """The operator's actions: cancel, run now (``adapters/actions.py``)."""
        return ActionQueries(self)

    @functools.cached_property
    def routines(self) -> MaintenanceQueries:
        """The maintenance routines' statements (``adapters/maintenance.py``)."""
        return MaintenanceQueries(self)

    @functools.cached_property
    def limits(self) -> LimitQueries:
        """Fleet-wide limits: running tasks, the database's clock
        (``adapters/limits.py``)."""
        return LimitQueries(self)

    @functools.cached_property
    def archive(self) -> ArchiveQueries:
        """The Spark archive's statements (``adapters/archive.py``)."""
        return ArchiveQueries(self.table)

    @functools.cached_property
    def workflow(self) -> WorkflowQueries:
        """Workflows' statements: steps, edges, releases
        (``adapters/workflow.py``)."""
        return WorkflowQueries(self)

    @functools.cached_property
    def workflow_purge(self) -> WorkflowPurgeQueries:
        """The purge of finished workflows' rows (``adapters/workflow_purge.py``)."""
        return WorkflowPurgeQueries(self)

    @functools.cached_property
    def workflow_view(self) -> WorkflowViewQueries:
        """The operator's view of a workflow (``adapters/workflow_view.py``)."""
        return WorkflowViewQueries(self)

    def fairness(self, column: str) -> FairnessQueries:
        """The key look-ups of per-key fairness on ``column``
        (``adapters/fairness.py``)."""
        return self._part(("fairness", column), lambda: FairnessQueries(self.table, column))

    def unique(self, keys: Table) -> UniqueQueries:
        """Unique tasks' statements, with ``keys`` the table's
        ``<table>_unique`` (``adapters/unique.py``)."""
        return self._part(("unique", keys), lambda: UniqueQueries(self.table, keys))

    def settings(self, table: Table) -> SettingRows:
        """The rows of configuration table ``table`` that sqla-queue writes
        (paused processes, periodic runs: ``adapters/configuration.py``).
        By name: each read of the configuration makes its own ``Table``."""
        return self._part(("settings", table.fullname), lambda: SettingRows(table))

    def _part(self, key: tuple[str, Any], build: Callable[[], _Part]) -> _Part:
        parts = self.__dict__.setdefault("_parts", {})
        found: _Part | None = parts.get(key)
        if found is None:  # a race builds twice, harmlessly
            found = parts[key] = build()
        return found

    # ------------------------------------------------------------ helpers
    def _ready(self) -> list[ColumnElement[bool]]:
        """The claim's test of a ready row: ``pendente``, due, and within
        this adapter's claim filter."""
        c = self.table.c
        where = [status_is(c.status, Status.PENDING), c.data_hora <= self.now()]
        routed = None if self.claim_filter is None else self.claim_filter.predicate(self.table)
        if routed is not None:
            where.append(routed)
        return where

    def now(self) -> ColumnElement[dt.datetime]:
        """The current time in SQL (the application's clock by default)."""
        return bindparam("now", callable_=utcnow, type_=UtcDateTime())

    def clock(self) -> ColumnElement[dt.datetime]:
        """The current time in SQL when the statement runs, not when its
        transaction began (``started_at``, ``finished_at``)."""
        return self.now()

    def _id_in(self, name: str) -> ColumnElement[bool]:
        return self.table.c.id.in_(bindparam(name, expanding=True))

    def lease_deadline(self) -> ColumnElement[dt.datetime]:
        """``lease_seconds`` from now, in SQL (the application's clock by
        default; the database's where the dialect can add an interval)."""
        return bindparam("lease_deadline", type_=UtcDateTime())

    def _lease_params(self, lease_seconds: float) -> dict[str, Any]:
        """The parameters :meth:`lease_deadline` binds."""
        return {"lease_deadline": utcnow() + dt.timedelta(seconds=lease_seconds)}

    def _lease_lost(self) -> ColumnElement[bool]:
        """The rescue's test of a 'processando' row: its lease has expired
        (a row without a lease, claimed before leases existed, too)."""
        c = self.table.c
        return or_(c.lease_expires_at.is_(None), c.lease_expires_at < self.now())

    def id_match(self, column: Any, name: str) -> ColumnElement[bool]:
        """``column IN (:name...)``, one parameter per value."""
        matched: ColumnElement[bool] = column.in_(bindparam(name, expanding=True))
        return matched

    def id_chunks(self, ids: Sequence[int]) -> list[list[int]]:
        """``ids`` in lists short enough for an index look-up. MariaDB turns
        an IN list of ``in_predicate_conversion_threshold`` (1,000) values
        or more into a join with a table of values, which it planned as a
        scan of the whole queue table beside 100,000 finished rows."""
        ids = list(ids)
        return [ids[at : at + IN_LIST_MAX] for at in range(0, len(ids), IN_LIST_MAX)]

    def force_index(self, statement: Any, index: str) -> Any:
        """``statement`` told to use ``index``, where the planner needs it."""
        return statement

    def prepare_engine(self, engine: Engine) -> None:
        """Per-dialect settings the worker needs on its own engine."""

    def proxied(self, conn: Connection) -> bool:
        """Whether ``conn`` reaches the server through a pooler or proxy
        (where the database can tell: PostgreSQL; :meth:`prepare_engine`'s
        engines only)."""
        return False

    def keep_lane_session(self, conn: Connection) -> None:
        """Keep a lane's work connection from being ended by the server for
        being idle while a handler works (PostgreSQL's idle timeouts)."""

    def guard_dead_peers(self, engine: Engine, *, server_side: bool = True) -> None:
        """Make ``engine``'s connections give up on a silent peer within
        ``dead_peer_seconds`` (liveness.py), on the client's side and, where
        the database lets a session choose and ``server_side`` allows (not
        behind a transaction-pooling proxy, where a session setting would
        reach another client), on the server's."""

    def routine_lock_holders(
        self, conn: Connection, *, keys: Mapping[int, str]
    ) -> list[LockHolder]:
        """Who holds the routine locks ``keys`` (lock key -> routine name)
        now, one entry per held lock; empty where the database cannot say."""
        return []

    def name_session(self, conn: Connection, name: str, *, local: bool = False) -> None:
        """Show ``name`` as ``conn``'s session in the server's list of
        sessions, where it has one (``local``: for the open transaction)."""

    def mark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        """Name ``conn`` as lane ``slot``'s working session of worker
        ``owner``, so that :meth:`end_sessions` can find it (where the
        server's side of a session cannot find a silent peer itself)."""

    def unmark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        """Undo :meth:`mark_session` (the lane stops; the connection may go
        back to the pool)."""

    def end_sessions(self, conn: Connection, *, owners: Sequence[str]) -> int:
        """End the marked sessions of workers ``owners``, whose claims were
        lost (the rescue took their tasks), so that what their open
        transactions hold is freed; how many were ended."""
        return 0

    def end_when_idle(self, conn: Connection, seconds: float, *, local: bool = False) -> None:
        """Have the server end ``conn``'s session once it has been idle for
        ``seconds`` (``local``: only while the open transaction lasts), where
        it can. The routine lock's connection, which its holder pings, so
        that a silent holder loses it."""

    def connect_claim(self, engine: Engine) -> Connection:
        conn = engine.connect()
        if self.claim_autocommit:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        return conn

    def connect_maintenance(self, engine: Engine) -> Connection:
        """A connection for the rescue and other routines: transactions at
        the database's READ COMMITTED or stricter, never autocommit (a
        failure and its retry row commit together)."""
        return engine.connect()

    def _records(
        self, keys: Sequence[str], rows: Sequence[Sequence[Any]], conn: Connection
    ) -> list[TaskRecord]:
        """Records for claimed rows, with the first attempt's payload on retries
        (the seed stores the payload on the first attempt only)."""
        payload_at = list(keys).index("payload")
        initial_at = list(keys).index("id_inicial")
        missing = {row[initial_at] for row in rows if row[payload_at] is None and row[initial_at]}
        if missing:
            payloads = dict(conn.execute(self._payloads, {"ids": sorted(missing)}).all())
            rows = [
                row
                if row[payload_at] is not None or row[initial_at] not in payloads
                else (*row[:payload_at], payloads[row[initial_at]], *row[payload_at + 1 :])
                for row in rows
            ]
        records = TaskRecord.from_rows(keys, rows)
        records.sort(key=lambda r: (-(r.priority or 0), r.run_at or _EPOCH, r.id))
        return records

    def _fetch_records(
        self, conn: Connection, statement: Any, parameters: Mapping[str, Any]
    ) -> list[TaskRecord]:
        result = conn.execute(statement, parameters)
        return self._records(list(result.keys()), result.all(), conn)

    # ------------------------------------------------------------ enqueue
    def task_insert_one(self, conn: Connection, *, row: Mapping[str, Any]) -> int:
        """Insert one row (seed column names); its id.

        The statement is compiled by SQLAlchemy once per set of columns and
        then runs on the connection's DBAPI cursor, inside the caller's
        transaction: SQLAlchemy's per-execute work (cache key, execution
        context, result object) was a fifth of an enqueue. Where
        :func:`statements_unobserved` says no, or the table has a
        Python-side default that is not a constant, the insert goes through
        ``conn.execute`` instead."""
        # NULL columns whose default is NULL anyway stay out of the statement
        null = self._null_by_default
        row = {name: value for name, value in row.items() if value is not None or name not in null}
        direct = (
            self._direct_insert(conn.dialect, tuple(row)) if statements_unobserved(conn) else None
        )
        if direct is None:
            return self._insert_one_core(conn, row)
        params = {**direct.defaults, **row}
        for name, process in direct.processors:
            params[name] = process(params[name])
        with DriverErrors(conn, direct.sql, params) as dbapi_connection:
            return int(self._run_direct_insert(dbapi_connection, direct, params))

    def _run_direct_insert(
        self, dbapi_connection: Any, direct: _DirectInsert, params: dict[str, Any]
    ) -> Any:
        """Run ``direct`` with ``params`` (processed) on the driver; the new id."""
        args: Any = params if direct.order is None else [params[name] for name in direct.order]
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(direct.sql, args)
            return cursor.fetchone()[0] if direct.returning else cursor.lastrowid
        finally:
            _close_quietly(cursor)

    def _insert_one_core(self, conn: Connection, row: Mapping[str, Any]) -> int:
        if conn.dialect.insert_returning:
            return int(
                conn.execute(insert(self.table).returning(self.table.c.id), row).scalar_one()
            )
        return int(conn.execute(insert(self.table), row).inserted_primary_key[0])  # type: ignore[index]

    def _direct_insert(self, dialect: Dialect, columns: tuple[str, ...]) -> _DirectInsert | None:
        # what the compiled text depends on: MySQL and MariaDB share a name
        # and a driver but not RETURNING; an engine may change the paramstyle
        key = (dialect.name, dialect.driver, dialect.paramstyle, dialect.insert_returning, columns)
        if key not in self._direct_inserts:  # a race compiles twice, harmlessly
            self._direct_inserts[key] = self._compile_direct_insert(dialect, columns)
        return self._direct_inserts[key]

    def _compile_direct_insert(
        self, dialect: Dialect, columns: tuple[str, ...]
    ) -> _DirectInsert | None:
        c = self.table.c
        defaults: dict[str, Any] = {}
        for column in c:
            if column.name in columns or column.default is None:
                continue
            if not column.default.is_scalar:  # a callable or a sequence: SQLAlchemy runs it
                return None
            defaults[column.name] = column.default.arg  # type: ignore[attr-defined]
        names = (*columns, *defaults)
        statement = insert(self.table).values(
            {name: bindparam(name, type_=c[name].type) for name in names}
        )
        returning = bool(dialect.insert_returning)
        if returning:
            statement = statement.returning(c.id)
        compiled = statement.compile(dialect=dialect)
        if set(compiled.binds) != set(names):  # bind names escaped: not worth a special case
            return None
        processors = []
        for name in names:
            process = c[name].type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors.append((name, process))
        return _DirectInsert(
            sql=compiled.string,
            order=tuple(compiled.positiontup or ()) if compiled.positional else None,
            defaults=defaults,
            processors=tuple(processors),
            returning=returning,
        )

    def _columns_of(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
        """The rows' values column by column, without the columns that are
        NULL in every row and NULL by default anyway (less to send and parse)."""
        count = len(rows)
        columns = {}
        for name in rows[0]:
            values = list(map(itemgetter(name), rows))
            if name in self._null_by_default and values.count(None) == count:
                continue
            columns[name] = values
        return columns

    def task_insert_many(self, conn: Connection, *, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Insert rows (seed column names, same keys in every row); new ids in order."""
        if not rows:
            return []
        if conn.dialect.insert_executemany_returning_sort_by_parameter_order:
            return list(conn.execute(self._insert_returning, list(rows)).scalars())
        stmt = insert(self.table)
        return [conn.execute(stmt, dict(row)).inserted_primary_key[0] for row in rows]  # type: ignore[index]

    def rows_insert_many(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """Insert ``rows`` (every column of ``table`` each, no server
        default to fill) into a table beside the queue table (the
        workflows'): one executemany."""
        if rows:
            conn.execute(insert(table), list(rows))

    def task_copy_many(self, conn: Connection, *, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Bulk insert through the database's COPY protocol."""
        raise UnsupportedOperationError(f"{self.family}: COPY (use insert_tasks)")

    def can_copy_text(self, conn: Connection) -> bool:
        """Whether :meth:`task_copy_text` may run on ``conn`` now."""
        return False

    def task_copy_text(
        self, conn: Connection, *, columns: Sequence[str], chunks: Iterable[str]
    ) -> None:
        """COPY rows the caller wrote in COPY's text format (PostgreSQL)."""
        raise UnsupportedOperationError(f"{self.family}: COPY (use insert_tasks)")

    def classify(self, exc: BaseException) -> ErrorKind:
        """The one reading of a driver error, at the boundary: what the
        worker does about it (see ErrorKind)."""
        if self.is_transient(exc):
            return ErrorKind.TRANSIENT
        if self.is_permanent(exc):
            return ErrorKind.PERMANENT
        if isinstance(exc, DBAPIError) and (
            exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))
        ):
            return ErrorKind.DISCONNECT
        return ErrorKind.OTHER

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a conflict that succeeds when retried
        (a deadlock, a lock wait timeout, a serialization failure)."""
        return False

    # ------------------------------------------------------------ subscriptions
    def subscription_list(
        self,
        conn: Connection,
        *,
        table: Table,
        process: str | None,
        tenant: int | None,
        company_group: str | None,
        columns: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Active rows of subscriber ``table`` for ``process`` whose tenant
        and company group are NULL or equal to those given, by id; each a
        dict by column name (``columns``; None: every column)."""
        c = table.c
        statement = (
            select(*(c if columns is None else [c[name] for name in columns]))
            .where(
                c.processo == process,
                c.ativo == true(),
                or_(c.tenant.is_(None), c.tenant == tenant),
                or_(c.grupo_empresarial.is_(None), c.grupo_empresarial == company_group),
            )
            .order_by(c.id)
        )
        return [dict(row) for row in conn.execute(statement).mappings()]

    def subscription_list_all(
        self, conn: Connection, *, table: Table, columns: Sequence[str]
    ) -> list[dict[str, Any]]:
        """Every row of subscriber ``table``, active or not, by process and
        id; each a dict of ``columns`` (the dashboard's list)."""
        c = table.c
        statement = select(*(c[name] for name in columns)).order_by(c.processo, c.id)
        return [dict(row) for row in conn.execute(statement).mappings()]

    def subscription_get_many(
        self, conn: Connection, *, table: Table, ids: Sequence[str], columns: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The rows of subscriber ``table`` whose id is one of ``ids``, in
        no order; each a dict of ``columns`` (a webhook delivery's read)."""
        c = table.c
        statement = select(*(c[name] for name in columns)).where(c.id.in_(list(ids)))
        return [dict(row) for row in conn.execute(statement).mappings()]

    # ------------------------------------------------------------ claim
    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        """Mark up to ``limit`` ready tasks ``processando`` for ``owner``, with
        a lease of ``lease_seconds``, commit that, and return them in claim
        order."""
        raise UnsupportedOperationError(f"{self.family}: task_claim_many")

    def task_claim_ids(
        self, conn: Connection, *, ids: Sequence[int], owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        """Mark the ready (``pendente``) rows among ``ids`` ``processando``
        for ``owner``, in the caller's transaction, and return them: the
        testing helpers' claim of given tasks (``sqla_queue.testing``)."""
        if not ids:
            return []
        c = self.table.c
        claim = (
            update(self.table)
            .where(self._id_in("ids"), status_is(c.status, Status.PENDING))
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("owner"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
        )
        params = {"ids": list(ids), "owner": owner}
        conn.execute(claim, {**params, **self._lease_params(lease_seconds)})
        claimed = select(*c).where(self._id_in("ids"), *self._claimed_by_owner)
        return self._fetch_records(conn, claimed, params)

    # ------------------------------------------------------------ requeue
    def task_dead_heads(
        self,
        conn: Connection,
        *,
        ids: Sequence[int] | None = None,
        process: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        limit: int,
    ) -> list[TaskRecord]:
        """The first rows of dead-letter runs (``dead``, no ``id_inicial``)
        that match, by id, at most ``limit``, locked until the transaction
        ends: ``ids`` (their ids or their ``live_id``), ``process``, and
        ``data_hora`` from ``since`` (inclusive) to ``until``."""
        c = self.table.c
        heads = select(self.table).where(c.dead == true(), c.id_inicial.is_(None))
        if ids is not None:
            heads = heads.where(c.id.in_(list(ids)) | c.live_id.in_(list(ids)))
        if process is not None:
            heads = heads.where(c.processo == process)
        if since is not None:
            heads = heads.where(c.data_hora >= since)
        if until is not None:
            heads = heads.where(c.data_hora < until)
        heads = heads.order_by(c.id).limit(limit).with_for_update()
        return self._fetch_records(conn, heads, {})

    def task_requeued_of(
        self, conn: Connection, *, live_ids: Sequence[int], head_ids: Sequence[int]
    ) -> set[int]:
        """Which of the dead-letter heads ``head_ids`` (of the chains
        ``live_ids``) a live chain was requeued from (its ``id_anterior``),
        with a locking read: it sees what another requeue committed while
        this one waited."""
        c = self.table.c
        statement = (
            select(c.id_anterior)
            .where(
                c.live_id.in_(list(live_ids)),
                c.dead == false(),
                c.id_inicial.is_(None),
                c.id_anterior.in_(list(head_ids)),
            )
            .with_for_update(read=True)
        )
        return {row[0] for row in conn.execute(statement)}

    def task_payloads(self, conn: Connection, *, ids: Sequence[int]) -> dict[int, str | None]:
        """The payload of each of the rows ``ids`` (those that exist)."""
        if not ids:
            return {}
        return {row[0]: row[1] for row in conn.execute(self._payloads, {"ids": list(ids)})}

    # ------------------------------------------------------------ equivalents
    def task_equivalents(
        self,
        conn: Connection,
        *,
        equal: Mapping[str, Any],
        statuses: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        not_null: Sequence[str] = (),
        any_of: tuple[str, Sequence[Any]] | None = None,
    ) -> list[Any]:
        """Rows equivalent to a task, one statement per index that holds
        ``statuses`` (None: every status; ``mixins.equivalence_criteria``)
        joined by UNION ALL: rows whose columns ``equal`` have those values
        (None: NULL), ``not_null`` are not NULL and, with ``any_of``
        (column, values), that column is one of the values. The whole rows
        by id, or just ``columns`` in no order."""
        c = self.table.c
        where: list[ColumnElement[bool]] = [
            c[name].is_(None) if value is None else c[name] == value
            for name, value in equal.items()
        ]
        where += [c[name].is_not(None) for name in not_null]
        if any_of is not None:
            where.append(c[any_of[0]].in_(list(any_of[1])))
        selected = list(c) if columns is None else [c[name] for name in columns]
        parts = [select(*selected).where(*where, arm) for arm in equivalence_criteria(c, statuses)]
        if not parts:
            return []
        if columns is not None:
            return list(conn.execute(parts[0] if len(parts) == 1 else union_all(*parts)).all())
        query = parts[0] if len(parts) == 1 else union_all(*parts).subquery().select()
        return list(conn.execute(query.order_by(query.selected_columns.id)).all())

    def task_promote_due(self, conn: Connection) -> int:
        """``agendada`` rows whose time has come become ``pendente`` (at most
        PROMOTE_CHUNK, skipping rows another transaction has locked)."""
        return conn.execute(self._promote).rowcount

    def task_ready_exists(self, conn: Connection) -> bool:
        """Whether a claim would find work: a ready row, or a scheduled row
        that is due (the queue server's look at the queue)."""
        c = self.table.c
        due = c.data_hora <= self.now()
        pending = exists().where(*self._ready())
        scheduled = exists().where(status_is(c.status, Status.SCHEDULED), due)
        return bool(conn.execute(select(or_(pending, scheduled))).scalar())

    def task_next_due(self, conn: Connection) -> dt.datetime | None:
        """When the earliest ``agendada`` row becomes due (None: there is none)."""
        value = conn.execute(self._next_due).scalar()
        return UtcDateTime().process_result_value(value, conn.dialect) if value else None

    # ------------------------------------------------------------ leases
    def task_lease_renew(
        self, conn: Connection, *, ids: Sequence[int], owner: str, lease_seconds: float
    ) -> int:
        """Push the lease of ``owner``'s claimed ``ids`` ``lease_seconds``
        ahead; the number of rows renewed."""
        if not ids:
            return 0
        params = {"ids": list(ids), "owner": owner, **self._lease_params(lease_seconds)}
        return conn.execute(self._renew, params).rowcount

    # ------------------------------------------------------------ finish
    def task_complete_many(
        self,
        conn: Connection,
        *,
        results: Sequence[tuple[int, str | None]],
        owner: str,
        commits: bool = False,
    ) -> int:
        """``sucesso`` with each message (None: the default message), for
        the rows still claimed by ``owner``; the number of rows completed.
        ``commits``: the transaction on ``conn`` is the worker's own batch
        and commits right after this (nothing else is written in it)."""
        if not results:
            return 0
        if len(results) == 1:
            [(task_id, message)] = results
            text_ = SUCCESS_MESSAGE if message is None else message
            params = {"b_id": task_id, "b_message": text_, "owner": owner}
            return self._rowcount(conn, self._complete_one, params, alone=commits)
        ids = [task_id for task_id, _ in results]
        done = conn.execute(self._complete, {"ids": ids, "owner": owner}).rowcount
        custom = [
            {"b_id": task_id, "b_message": message}
            for task_id, message in results
            if message is not None
        ]
        if custom and done == len(ids):
            conn.execute(self._complete_custom, custom)
        return int(done)

    def _rowcount(
        self, conn: Connection, statement: Any, values: Mapping[str, Any], *, alone: bool = False
    ) -> int:
        """``statement`` (one of this adapter's, without a RETURNING list)
        run with ``values``: its rowcount. ``alone``: the transaction on
        ``conn`` commits right after it, so where nothing was sent in it yet
        the statement may commit by itself. An adapter may run it its own way."""
        return int(conn.execute(statement, values).rowcount)

    def task_update_claimed(
        self,
        conn: Connection,
        *,
        task_id: int,
        values: Mapping[str, Any],
        owner: str | None,
        lease_expires_at: dt.datetime | object | None = ...,
    ) -> bool:
        """Set columns of a row that is still ``processando`` for ``owner``
        (and, when given, still has that lease: the rescue's check that the
        worker did not renew it meanwhile). Whether the row was changed."""
        c = self.table.c
        where = [c.id == task_id, status_is(c.status, Status.PROCESSING)]
        where.append(c.worker_id.is_(None) if owner is None else c.worker_id == owner)
        if lease_expires_at is not ...:
            where.append(c.lease_expires_at.is_not_distinct_from(lease_expires_at))
        return bool(conn.execute(update(self.table).where(*where).values(**values)).rowcount)

    def task_hand_back_many(self, conn: Connection, *, ids: Sequence[int], owner: str) -> int:
        """Claimed tasks that never ran go back to ``pendente``."""
        if not ids:
            return 0
        return conn.execute(self._hand_back, {"ids": list(ids), "owner": owner}).rowcount

    # ------------------------------------------------------------ rescue
    def task_rescue_lost(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        """``processando`` rows whose claim is lost (lease expired, or the
        worker's per-task lock died), oldest first, locked for the rest of
        ``conn``'s transaction where the database can."""
        ids = conn.execute(self._lost, {"limit": limit}).scalars().all()
        if not ids:
            return []
        return self._fetch_records(conn, self._rows_by_id, {"ids": list(ids)})

    # ------------------------------------------------------------ locks
    def lock_release_many(self, conn: Connection, *, ids: Sequence[int]) -> None:
        """Release the per-task locks the claim connection took. A dialect
        without per-task locks took none, so it has nothing to release."""
        if self.task_locks:
            raise UnsupportedOperationError(f"{self.family}: lock_release_many")

    def lock_writers(self, conn: Connection) -> None:
        """Make ``conn``'s transaction the table's only writer until it ends,
        before a check-then-insert that row locks must guard. Where
        ``FOR UPDATE`` locks rows (here), it guards them: nothing to do."""

    def connect_bulk(self, engine: Engine) -> Connection:
        """A connection for a bulk writer (the Spark enqueue's partitions)."""
        return engine.connect()

    def bucket_lock(
        self, conn: Connection, *, namespace: int, bucket: int, wait_seconds: float
    ) -> str | None:
        """Serialise writers of one dedupe bucket (``namespace``, ``bucket``)
        until ``conn``'s transaction ends; the name of a lock that outlives
        it (release it with :meth:`bucket_unlock` after the commit), or
        None. Here (SQLite) the transaction holds the write lock already."""
        return None

    def bucket_unlock(self, conn: Connection, name: str) -> None:
        """Free a lock :meth:`bucket_lock` named."""

    def routine_lock(self, engine: Engine) -> Any:
        """The maintenance routines' lock on this database (a
        ``RoutineLock``: ``sqla_queue.adapters.locks``)."""
        raise UnsupportedOperationError(f"{self.family}: routine_lock")

    def lock_try(self, conn: Connection, *, key: int) -> bool:
        """Try to take maintenance lock ``key`` on ``conn``, without waiting."""
        raise UnsupportedOperationError(f"{self.family}: lock_try")

    def lock_release(self, conn: Connection, *, key: int) -> None:
        raise UnsupportedOperationError(f"{self.family}: lock_release")

    # ------------------------------------------------------------ vacuum
    def table_vacuum_state(self, conn: Connection, horizon_seconds: float) -> VacuumState:
        """The table's dead tuples, and what holds the vacuum horizon: the
        transactions (and prepared ones) older than ``horizon_seconds``,
        the replication slots and standbys whatever their age."""
        raise UnsupportedOperationError(f"{self.family}: table_vacuum_state")

    def table_health(self, conn: Connection) -> TableHealth | None:
        """The table's sizes, dead tuples and vacuum horizon, where the
        database counts them (None elsewhere)."""
        return None

    def table_vacuum(self, conn: Connection) -> None:
        """Vacuum the table (outside any transaction)."""
        raise UnsupportedOperationError(f"{self.family}: table_vacuum")

    # ------------------------------------------------------------ errors
    def is_permanent(self, exc: BaseException) -> bool:
        """Whether a connection error will not go away by waiting (the
        database does not exist, authentication failed)."""
        return False

    def missing_columns(self, conn: Connection) -> list[str]:
        """sqla-queue's own columns that the table in the database lacks."""
        present = {
            column["name"]
            for column in inspect(conn).get_columns(self.table.name, schema=self.table.schema)
        }
        return [name for name in OWN_COLUMNS if name not in present]

    # ------------------------------------------------------------ wake-ups
    def notify(self, conn: Connection) -> None:
        """Wake the workers listening on this queue's channel."""
        raise UnsupportedOperationError(f"{self.family}: notify")

    def listener(self, engine: Engine) -> Listener:
        raise UnsupportedOperationError(f"{self.family}: listener")
