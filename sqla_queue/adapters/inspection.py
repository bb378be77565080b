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
  among the rows inserted after it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Table,
    bindparam,
    case,
    delete,
    false,
    func,
    insert,
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

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["InspectionQueries"]

#: the newest failures are looked for among this many newest attempts
FAILURE_LOOKBACK = 100_000
#: ids read per statement while looking for them
FAILURE_WINDOW = 10_000
#: the most rows a timeline reads per step (a chain of 100 attempts, its
#: dead-letter runs and their retries fit many times over)
TIMELINE_LIMIT = 5_000


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
                func.count().label("n"),
                recent.label("recent"),
                func.min(c.id).label("low"),
                func.max(c.finished_at).label("finished"),
            )
            .where(c.id >= low, c.id <= high, status_is(c.status, *CLOSED_STATUSES))
            .group_by(c.id // size, c.processo, c.tenant, c.status, dead, requeued, head)
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

    # ------------------------------------------------------------ counts
    def open_groups(self, conn: Connection) -> list[Any]:
        """(processo, tenant, status, dead, later, head, n, oldest) of the
        open attempts: ``later`` 1 for an attempt after the first, ``head``
        1 for a chain's first row."""
        return list(conn.execute(self._open))

    def closed_range(
        self, conn: Connection, *, since: dt.datetime, low: int, high: int, size: int
    ) -> list[Any]:
        """(k, processo, tenant, status, dead, requeued, head, n, recent,
        low, finished) of the finished attempts with ids ``low`` to ``high``
        (a primary-key range): ``k`` the range of ``size`` ids, ``recent``
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
