"""The statements that look at a queue table for an operator (``sqla-queue
status``, :mod:`sqla_queue.ops.status`, the dashboard), beside the adapter
they extend.

Portable SQLAlchemy Core, built once per queue table. What each costs on a
table of millions of finished attempts:

- the open states (ready, scheduled, retrying, running) read the partial
  indexes of ``pendente``, ``agendada`` and ``processando`` (PostgreSQL,
  SQLite) or the status indexes (MySQL family): their cost follows the
  backlog, not the table;
- the finished states (succeeded, failed, the dead letter) and the recent
  throughput are one pass over the finished attempts the first time (the
  one statement whose cost follows the table: docs/operations.md has it
  measured), then primary-key ranges of them (``status_summary.py``);
- the running tasks read ``ix_processando``; the newest failures read the
  primary key backwards over the newest attempts only;
- a chain's timeline reads its rows by ``id``, ``id_inicial`` and
  ``live_id`` (each indexed), and its pub/sub copies by ``publication_id``
  among the rows inserted after it;
- the task list (the dashboard's ``/api/tasks``, :meth:`~InspectionQueries.task_page`)
  reads an open state through that status's index (``ix_processando`` is
  in id order; ``ix_pendente``, ``ix_pendente_processo`` and
  ``ix_agendada`` hold the backlog, sorted by id after the read), and any
  other list (a finished state, or no state) the primary key backwards, in
  closed ranges of ``TASK_LIST_WINDOW`` ids, at most ``TASK_LIST_BUDGET``
  ids a call: a page of rare rows (the cancelled, the dead letter) on a
  table of millions costs that much at most, and may come back short with a
  cursor to go on from;
- the workers holding tasks (:meth:`~InspectionQueries.lease_holders`) read
  ``ix_processando``;
- the finished attempts per time bucket (the dashboard's history,
  :meth:`~InspectionQueries.finished_history`) read a closed range of
  primary keys: ``finished_at`` has no index, so the caller names the id
  ranges that may hold recent finishes (``status_counts.ranges_finished_since``).

The task states (:data:`TASK_STATES`) are those ``sqla-queue status``
counts: one predicate each, :meth:`~InspectionQueries.state_filter`, and
:func:`task_state` says the same of a row read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    case,
    delete,
    false,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.orm import Session

from ..common.types import UtcDateTime
from ..schema.mixins import (
    CLOSED_STATUSES,
    OPEN_STATUSES,
    Status,
    inline_count,
    status_is,
    status_literal,
)
from ..schema.rows import CANCELLED_MESSAGES

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = [
    "TASK_STATES",
    "InspectionQueries",
    "TaskPage",
    "cancelled_attempt",
    "task_state",
]

#: the newest failures are looked for among this many newest attempts
FAILURE_LOOKBACK = 100_000
#: ids read per statement while looking for them
FAILURE_WINDOW = 10_000
#: the most rows a timeline reads per step (a chain of 100 attempts, its
#: dead-letter runs and their retries fit many times over)
TIMELINE_LIMIT = 5_000
#: the task states, as ``sqla-queue status`` counts them (ops/status.py
#: ``STATES``): ``cancelled`` is a waiting task an operator cancelled
#: or its workflow cancelled (``falha`` with one of ``CANCELLED_MESSAGES``),
#: which ``failed`` leaves out
TASK_STATES = (
    "ready",
    "scheduled",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "cancelled",
    "dead_letter",
)
#: the states whose rows an index holds apart from the finished history
_OPEN_STATES = frozenset({"ready", "scheduled", "running", "retrying"})
#: those whose index is not in id order: their rows are sorted once read
_SORTED_STATES = frozenset({"ready", "scheduled", "retrying"})
#: the most buckets one history statement counts (a day by 15 minutes: 96)
HISTORY_BUCKETS_MAX = 200
#: the task list reads the primary key backwards this many ids a statement
TASK_LIST_WINDOW = 10_000
#: and at most this many ids a call (a short page then, and a cursor)
TASK_LIST_BUDGET = 100_000


@dataclass(frozen=True)
class TaskPage:
    """One page of the task list, newest first: ``rows`` and the cursor to
    read on from (``before``: the next page's ids are below it; None: no
    more rows)."""

    rows: list[Any]
    before: int | None


def task_state(row: Any) -> str | None:
    """The state (:data:`TASK_STATES`) :meth:`InspectionQueries.state_filter`
    gives a row (``status``, ``tentativa``, ``dead``, ``id_inicial``,
    ``reenfileirado``, ``mensagem``). None for a row in none: an attempt a
    retry followed (``reenfileirado``), a dead-letter run's retry."""
    if row.dead:
        return "dead_letter" if row.id_inicial is None else None
    status, later = row.status, (row.tentativa or 1) > 1
    if status == Status.PENDING.value:
        return "retrying" if later else "ready"
    if status == Status.SCHEDULED.value:
        return "retrying" if later else "scheduled"
    if status == Status.PROCESSING.value:
        return "running"
    if row.reenfileirado:
        return None
    if status == Status.SUCCEEDED.value:
        return "succeeded"
    if status == Status.FAILED.value and row.mensagem in CANCELLED_MESSAGES:
        return "cancelled"
    if status in (Status.FAILED.value, Status.FAILED_PROCESSING.value):
        return "failed"
    return None


def cancelled_attempt(c: Any) -> ColumnElement[bool]:
    """An attempt cancelled while it waited: by the operator (``sqla-queue
    cancel``, client/control.py) or by its workflow (``falha`` with one of
    ``CANCELLED_MESSAGES``); ``c``: the queue table's columns. The one
    definition of the ``cancelled`` state."""
    return and_(status_is(c.status, Status.FAILED), c.mensagem.in_(CANCELLED_MESSAGES))


class InspectionQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        c = adapter.table.c
        later = case((func.coalesce(c.tentativa, 1) > 1, 1), else_=0)
        head = case((c.id_inicial.is_(None), 1), else_=0)
        dead = case((c.dead == true(), 1), else_=0)
        #: one statement per open status, each its own index's predicate
        self._open = union_all(
            *(
                select(
                    c.processo,
                    c.tenant,
                    status_literal(status).label("status"),
                    dead.label("dead"),
                    later.label("later"),
                    head.label("head"),
                    func.count().label("n"),
                    func.min(c.data_hora).label("oldest"),
                )
                .where(status_is(c.status, status))
                .group_by(c.processo, c.tenant, dead, later, head)
                for status in OPEN_STATUSES
            )
        )
        requeued = case((func.coalesce(c.reenfileirado, false()) == true(), 1), else_=0)
        since = bindparam("since", type_=UtcDateTime())
        recent = func.sum(case((c.finished_at >= since, 1), else_=0))
        cancelled = case((cancelled_attempt(c), 1), else_=0)
        # the finished attempts by kind, over a range of ids and by range of
        # ``size`` ids (status_summary.py), with what is kept of each range:
        # its smallest id and newest finish
        low, high = bindparam("low", type_=BigInteger), bindparam("high", type_=BigInteger)
        size = inline_count("size", big=True)
        self._closed_range = (
            select(
                (c.id // size).label("k"),
                c.processo,
                c.tenant,
                c.status,
                dead.label("dead"),
                requeued.label("requeued"),
                head.label("head"),
                cancelled.label("cancelled"),
                func.count().label("n"),
                recent.label("recent"),
                func.min(c.id).label("low"),
                func.max(c.finished_at).label("finished"),
            )
            .where(c.id >= low, c.id <= high, status_is(c.status, *CLOSED_STATUSES))
            .group_by(c.id // size, c.processo, c.tenant, c.status, dead, requeued, head, cancelled)
        )
        #: open attempts per range of ids, one statement per status's index
        self._open_ranges = union_all(
            *(
                select((c.id // size).label("k"), func.count().label("n"))
                .where(status_is(c.status, status))
                .group_by(c.id // size)
                for status in OPEN_STATUSES
            )
        )
        self._id_bounds = select(func.min(c.id), func.max(c.id))
        limit = inline_count()
        self._running = (
            select(
                c.id,
                c.id_inicial,
                c.processo,
                c.tenant,
                c.tentativa,
                c.dead,
                c.worker_id,
                c.started_at,
                c.lease_expires_at,
                c.data_hora,
            )
            .where(status_is(c.status, Status.PROCESSING))
            .order_by(c.id)
            .limit(limit)
        )
        self._max_id = select(func.max(c.id))
        self._failures = (
            select(
                c.id,
                c.id_inicial,
                c.processo,
                c.tenant,
                c.tentativa,
                c.dead,
                c.status,
                c.mensagem,
                c.finished_at,
                c.data_hora,
                c.worker_id,
            )
            .where(
                c.id > bindparam("low"),
                c.id <= bindparam("high"),
                status_is(c.status, Status.FAILED, Status.FAILED_PROCESSING),
            )
            .order_by(c.id.desc())
            .limit(limit)
        )
        self._row = select(adapter.table).where(c.id == bindparam("task_id"))
        by = adapter.table.select().order_by(c.id).limit(TIMELINE_LIMIT)
        # one statement per index (an OR of the two reads the whole table)
        self._by_chain = [
            by.where(adapter.id_match(c.id, "keys")),
            by.where(adapter.id_match(c.id_inicial, "keys")),
        ]
        self._by_live = by.where(adapter.id_match(c.live_id, "keys"))
        self._copies = by.where(
            adapter.id_match(c.publication_id, "keys"), c.id > bindparam("after")
        )

        # the dead-letter runs and the chains requeued from them: heads that
        # carry a live_id (ix_<table>_live), newest task first
        self._dead_letters = (
            select(
                c.id,
                c.live_id,
                c.dead,
                c.processo,
                c.status,
                c.data_hora,
                c.finished_at,
                c.mensagem,
            )
            .where(c.live_id.is_not(None), c.id_inicial.is_(None))
            .order_by(c.live_id.desc(), c.id)
            .limit(limit)
        )
        self._copies_window = (
            select(
                c.id,
                c.id_inicial,
                c.subscriber_id,
                c.publication_id,
                c.processo,
                c.status,
                c.tentativa,
                c.dead,
                c.data_hora,
                c.started_at,
                c.finished_at,
                c.worker_id,
                c.mensagem,
            )
            .where(
                c.id > bindparam("low"),
                c.id <= bindparam("high"),
                c.subscriber_id.is_not(None),
            )
            .order_by(c.id.desc())
            .limit(limit)
        )
        self._state_filters = _state_filters(c)
        self._open_terms = _open_terms(c)
        # a row in some state: the union of the state filters, said shorter
        self._listed = or_(
            and_(
                c.dead == false(),
                or_(
                    status_is(c.status, *OPEN_STATUSES),
                    func.coalesce(c.reenfileirado, false()) == false(),
                ),
            ),
            and_(c.dead == true(), c.id_inicial.is_(None)),
        )
        self._page = (
            select(
                c.id,
                c.id_inicial,
                c.processo,
                c.status,
                c.tentativa,
                c.dead,
                c.reenfileirado,
                c.mensagem,
                c.chave_externa,
                c.payload,
                c.data_hora,
                c.started_at,
                c.finished_at,
            )
            .order_by(c.id.desc())
            .limit(limit)
        )
        # Sorted by an expression, not by id: a planner sees no order to read
        # the primary key in, and reads the status's index. Without
        # statistics SQLite (and PostgreSQL, when it guesses few matches)
        # would rather walk the primary key backwards, filtering every
        # finished row on the way, than sort the backlog.
        self._page_sorted = self._page.order_by(None).order_by((c.id + literal_column("0")).desc())
        # ix_processando (PostgreSQL, SQLite), the status indexes (MySQL family)
        self._lease_holders = (
            select(
                c.worker_id,
                func.count().label("tasks"),
                func.max(c.lease_expires_at).label("lease_expires_at"),
                func.max(c.started_at).label("started_at"),
            )
            .where(status_is(c.status, Status.PROCESSING), c.worker_id.is_not(None))
            .group_by(c.worker_id)
            .order_by(c.worker_id)
        )
        #: finished_history's statement per number of buckets
        self._history: dict[int, Any] = {}

    # ------------------------------------------------------------ counts
    def open_groups(self, conn: Connection) -> list[Any]:
        """(processo, tenant, status, dead, later, head, n, oldest) of the
        open attempts: ``later`` 1 for an attempt after the first, ``head``
        1 for a chain's first row."""
        return list(conn.execute(self._open))

    def closed_range(
        self, conn: Connection, *, since: dt.datetime, low: int, high: int, size: int
    ) -> list[Any]:
        """(k, processo, tenant, status, dead, requeued, head, cancelled, n,
        recent, low, finished) of the finished attempts with ids ``low`` to
        ``high`` (a primary-key range): ``k`` the range of ``size`` ids,
        ``cancelled`` 1 for an operator's cancellation, ``recent``
        how many finished at or after ``since``, ``low`` the group's
        smallest id, ``finished`` its newest ``finished_at``."""
        params = {"since": since, "low": low, "high": high, "size": size}
        return list(conn.execute(self._closed_range, params))

    def writes_apart(self, engine: Engine, *, after_own_connection: bool) -> bool:
        """Whether a status may write its kept counts on a connection of its
        own now. On SQLite only once its own connection is closed (the one
        writer would wait for a caller's open transaction), and never on an
        in-memory database (one connection, shared)."""
        if engine.dialect.name != "sqlite":
            return True
        return after_own_connection and engine.url.database not in (None, "", ":memory:")

    def open_by_range(self, conn: Connection, size: int) -> dict[int, int]:
        """How many open attempts each range of ``size`` ids holds (range
        ``k``: ids ``k * size`` to ``(k + 1) * size - 1``)."""
        counts: dict[int, int] = {}
        for k, n in conn.execute(self._open_ranges, {"size": size}):
            counts[int(k)] = counts.get(int(k), 0) + int(n)
        return counts

    def id_bounds(self, conn: Connection) -> tuple[int | None, int | None]:
        """The smallest and the largest id in the table (None, None: empty)."""
        low, high = conn.execute(self._id_bounds).one()
        return low, high

    # ------------------------------------------------------------ rows
    def running(self, conn: Connection, *, limit: int) -> list[Any]:
        return list(conn.execute(self._running, {"limit": limit}))

    def newest_failures(self, conn: Connection, *, limit: int) -> list[Any]:
        """The newest failed attempts among the ``FAILURE_LOOKBACK`` newest
        attempts, newest first. Read a window of ids at a time: a range
        closed at both ends is a primary-key range scan on every planner
        (an open one, on a table never analysed, can look like most of it)."""
        return self._windowed(conn, self._failures, limit)

    def dead_letters(self, conn: Connection, *, limit: int) -> list[Any]:
        """(id, live_id, dead, processo, status, data_hora, finished_at,
        mensagem) of the dead-letter runs' and requeued chains' first rows,
        newest task first, up to ``limit`` rows."""
        return list(conn.execute(self._dead_letters, {"limit": limit}))

    def newest_copies(self, conn: Connection, *, limit: int) -> list[Any]:
        """The newest pub/sub copies' attempts (webhook deliveries among
        them), among the ``FAILURE_LOOKBACK`` newest attempts."""
        return self._windowed(conn, self._copies_window, limit)

    def _windowed(self, conn: Connection, statement: Any, limit: int) -> list[Any]:
        newest = conn.execute(self._max_id).scalar()
        found: list[Any] = []
        high = int(newest or 0)
        floor = high - FAILURE_LOOKBACK
        while high > floor and len(found) < limit:
            low = max(floor, high - FAILURE_WINDOW)
            found += conn.execute(
                statement, {"low": low, "high": high, "limit": limit - len(found)}
            )
            high = low
        return found

    def state_filter(self, state: str) -> ColumnElement[bool]:
        """The rows in ``state`` (one of :data:`TASK_STATES`), as the
        counts of ``sqla-queue status`` define it: the one predicate of
        each state. Raises KeyError for another name."""
        return self._state_filters[state]

    def task_page(
        self,
        conn: Connection,
        *,
        limit: int,
        state: str | None = None,
        process: str | None = None,
        external_key: str | None = None,
        min_id: int | None = None,
        max_id: int | None = None,
        before: int | None = None,
    ) -> TaskPage:
        """Up to ``limit`` rows in ``state`` (any of :data:`TASK_STATES`
        when None), of ``process`` and ``external_key`` when given, with
        ids from ``min_id`` to ``max_id`` and below ``before``, newest
        first: (id, id_inicial, processo, status, tentativa, dead,
        reenfileirado, mensagem, chave_externa, payload, data_hora,
        started_at, finished_at). An open state reads its status's index;
        the rest reads the primary key in windows, at most
        ``TASK_LIST_BUDGET`` ids, so a page can be short (even empty) with
        a cursor: only ``before`` None says there is no more."""
        c = self.adapter.table.c
        where = [self._state_filters[state] if state is not None else self._listed]
        if process is not None:
            where.append(c.processo == bindparam("process"))
        if external_key is not None:
            where.append(c.chave_externa == bindparam("external_key"))
        params: dict[str, Any] = {"process": process, "external_key": external_key}
        high = min(
            (x for x in (max_id, None if before is None else before - 1) if x is not None),
            default=None,
        )
        if state in _OPEN_STATES:
            if high is not None:
                where.append(c.id <= bindparam("high"))
            if min_id is not None:
                where.append(c.id >= bindparam("low"))
            statement = self._page_sorted if state in _SORTED_STATES else self._page
            values = {**params, "high": high, "low": min_id, "limit": limit + 1}
            # one statement per status's index, the state's filter split
            held = [
                row
                for term in self._open_terms[state]
                for row in conn.execute(statement.where(term, *where[1:]), values)
            ]
            held.sort(key=lambda row: row.id, reverse=True)
            return _paged(held[: limit + 1], limit)
        floor, newest = self.id_bounds(conn)
        if floor is None or newest is None:
            return TaskPage([], None)
        floor = max(floor, min_id) if min_id is not None else floor
        high = newest if high is None else min(high, newest)
        window = self._page.where(*where, c.id >= bindparam("low"), c.id <= bindparam("high"))
        found: list[Any] = []
        read = 0
        while high >= floor and len(found) <= limit and read < TASK_LIST_BUDGET:
            low = max(floor, high - TASK_LIST_WINDOW + 1)
            found += conn.execute(
                window, {**params, "low": low, "high": high, "limit": limit + 1 - len(found)}
            )
            read += high - low + 1
            high = low - 1
        if len(found) <= limit and high >= floor:
            return TaskPage(found, high + 1)  # the budget ran out first
        return _paged(found, limit)

    def lease_holders(self, conn: Connection) -> list[Any]:
        """(worker_id, tasks, lease_expires_at, started_at) of each worker
        holding ``processando`` rows, by worker_id: how many it holds, the
        newest lease deadline among them (its heartbeat's last renewal plus
        its lease) and its newest claim."""
        return list(conn.execute(self._lease_holders))

    # ------------------------------------------------------------ history
    def finished_history(
        self,
        conn: Connection,
        *,
        low: int,
        high: int,
        since: dt.datetime,
        bucket_seconds: float,
        buckets: int,
    ) -> list[Any]:
        """(bucket, processo, succeeded, failed, cancelled) of the attempts
        with ids ``low`` to ``high`` (a primary-key range) that finished in
        one of ``buckets`` buckets of ``bucket_seconds`` from ``since``:
        ``bucket`` 0 is ``since`` to ``since + bucket_seconds`` (excluded).
        Attempts, as the throughput counts them: a dead-letter run's too;
        ``cancelled`` by :func:`cancelled_attempt`, ``failed`` the other
        ``falha`` and ``falha_processando``. Only groups with an attempt."""
        if not 1 <= buckets <= HISTORY_BUCKETS_MAX:
            raise ValueError(f"buckets must be 1 to {HISTORY_BUCKETS_MAX}, not {buckets}")
        statement = self._history.get(buckets)
        if statement is None:
            statement = self._history[buckets] = _history_statement(self.adapter.table.c, buckets)
        step = dt.timedelta(seconds=bucket_seconds)
        bounds = {f"b{i}": since + i * step for i in range(buckets + 1)}
        return list(conn.execute(statement, {"low": low, "high": high, **bounds}))

    def task_row(self, conn: Connection, *, task_id: int) -> Any:
        return conn.execute(self._row, {"task_id": task_id}).first()

    def chain_rows(self, conn: Connection, *, keys: Sequence[int]) -> list[Any]:
        """The rows whose id or id_inicial is one of ``keys``."""
        found = self._chunked(conn, self._by_chain[0], keys)
        found += self._chunked(conn, self._by_chain[1], keys)
        return sorted(found, key=lambda row: row.id)

    def live_rows(self, conn: Connection, *, keys: Sequence[int]) -> list[Any]:
        """The rows whose live_id is one of ``keys`` (dead-letter runs and
        chains requeued from them)."""
        return self._chunked(conn, self._by_live, keys)

    def copies(self, conn: Connection, *, publications: Sequence[int]) -> list[Any]:
        """The pub/sub copies of the attempts ``publications``."""
        if not publications:
            return []
        after = min(publications)
        return self._chunked(conn, self._copies, publications, after=after)

    def tasks_of_model(
        self,
        session: Session,
        model: type[Any],
        *,
        process: str | None = None,
        status: str | None = None,
    ) -> list[Any]:
        """The ``model`` objects (mapped to this table) in ``session``'s
        view, oldest first: of ``process`` and with ``status`` when given
        (the testing helpers' ``enqueued``)."""
        query = select(model).order_by(model.id)
        if process is not None:
            query = query.where(model.process == process)
        if status is not None:
            query = query.where(model.status == status)
        return list(session.scalars(query))

    # the finished states' counts kept per range of ids (status_summary.py)
    def counts_kept(self, conn: Connection, *, store: Table) -> list[Any]:
        """Every row of ``store``, the queue's ``<table>_status``."""
        return list(conn.execute(select(store)).all())

    def counts_keep(
        self,
        conn: Connection,
        *,
        store: Table,
        rows: Sequence[Mapping[str, Any]],
        drop: Sequence[int],
    ) -> None:
        """Delete the rows of ``store`` whose ``range_id`` is one of ``drop``
        (500 a statement), then insert ``rows``."""
        for start in range(0, len(drop), 500):
            conn.execute(delete(store).where(store.c.range_id.in_(list(drop[start : start + 500]))))
        if rows:
            conn.execute(insert(store), list(rows))

    def _chunked(
        self, conn: Connection, statement: Any, keys: Sequence[int], **params: Any
    ) -> list[Any]:
        found: dict[int, Any] = {}
        for chunk in self.adapter.id_chunks(sorted(set(keys))):
            for row in conn.execute(statement, {"keys": chunk, **params}):
                found[row.id] = row
        return [found[key] for key in sorted(found)]


def _open_terms(c: Any) -> dict[str, list[ColumnElement[bool]]]:
    """The open states, each as one predicate per status, on that status's
    index (a status literal: a bound value, or an ``IN``, implies no
    partial index's predicate; SQLite reads an OR of two by neither)."""
    alive = c.dead == false()
    first = func.coalesce(c.tentativa, 1) <= 1
    pending, scheduled = status_is(c.status, Status.PENDING), status_is(c.status, Status.SCHEDULED)
    return {
        "ready": [and_(pending, first, alive)],
        "scheduled": [and_(scheduled, first, alive)],
        "running": [and_(status_is(c.status, Status.PROCESSING), alive)],
        "retrying": [and_(pending, ~first, alive), and_(scheduled, ~first, alive)],
    }


def _state_filters(c: Any) -> dict[str, ColumnElement[bool]]:
    """Each state of :data:`TASK_STATES` as a predicate."""
    alive = c.dead == false()
    newest = func.coalesce(c.reenfileirado, false()) == false()
    return {
        **{state: or_(*terms) for state, terms in _open_terms(c).items()},
        "succeeded": and_(status_is(c.status, Status.SUCCEEDED), newest, alive),
        "failed": and_(
            or_(
                and_(
                    status_is(c.status, Status.FAILED),
                    or_(c.mensagem.is_(None), c.mensagem.not_in(CANCELLED_MESSAGES)),
                ),
                status_is(c.status, Status.FAILED_PROCESSING),
            ),
            newest,
            alive,
        ),
        "cancelled": and_(cancelled_attempt(c), newest, alive),
        "dead_letter": and_(c.dead == true(), c.id_inicial.is_(None)),
    }


def _history_statement(c: Any, buckets: int) -> Any:
    """finished_history's statement for ``buckets`` buckets, bounded by
    ``b0`` to ``b<buckets>``: the bucket a CASE of the bounds (portable,
    where epoch arithmetic is each dialect's own), grouped outside a
    subquery (PostgreSQL binds each parameter apart, so a GROUP BY of an
    expression of parameters would not match its SELECT)."""
    at = [bindparam(f"b{i}", type_=UtcDateTime()) for i in range(buckets + 1)]
    later = [(c.finished_at >= at[i], i) for i in range(buckets - 1, 0, -1)]
    bucket = case(*later, else_=0) if later else literal_column("0")
    outcome = case(
        (status_is(c.status, Status.SUCCEEDED), 0),
        (cancelled_attempt(c), 2),
        else_=1,
    )
    low, high = bindparam("low", type_=BigInteger), bindparam("high", type_=BigInteger)
    finished = (
        select(bucket.label("bucket"), c.processo, outcome.label("outcome"))
        .where(
            c.id >= low,
            c.id <= high,
            status_is(c.status, *CLOSED_STATUSES),
            c.finished_at >= at[0],
            c.finished_at < at[buckets],
        )
        .subquery()
    )
    f = finished.c
    return (
        select(
            f.bucket,
            f.processo,
            *(
                func.sum(case((f.outcome == code, 1), else_=0)).label(name)
                for code, name in ((0, "succeeded"), (1, "failed"), (2, "cancelled"))
            ),
        )
        .group_by(f.bucket, f.processo)
        .order_by(f.bucket, f.processo)
    )


def _paged(found: list[Any], limit: int) -> TaskPage:
    """``found`` (up to ``limit`` + 1 rows) as a page: a cursor when there
    was one more."""
    if len(found) > limit:
        return TaskPage(found[:limit], found[limit - 1].id)
    return TaskPage(found, None)
