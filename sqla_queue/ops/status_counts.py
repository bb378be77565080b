"""The finished states' counts without a pass over every finished attempt.

``sqla-queue status`` counts finished chains (succeeded, failed, dead
letter) from the finished attempts, and on a table of millions of them one
pass over all of them takes seconds (benchmarks/inspect_cost.py). A
finished attempt does not change: sqla-queue's workers and routines only
ever write open rows (``pendente``, ``agendada``, ``processando``) and
insert new ones, and ids only grow. So a process that asks more than once
(the dashboard, ``status --watch``, an application's own monitoring) counts
per range of ``CHUNK_IDS`` ids, keeps the counts in memory, and reuses a
range's counts until something could have changed them:

- its open attempts are not as many as when it was counted (one finished,
  was cancelled or expired: it is now a finished attempt of that range);
- it is one of the two newest ranges (new ids, and transactions that took
  an id and have not committed yet, land there);
- its smallest id is gone (a purge from below);
- a row of it finished at or after the start of the throughput window
  (the window's count needs its rows);
- it was counted more than ``STALE_SECONDS`` ago: up to ``STALE_PER_CALL``
  such ranges, the oldest first, are counted again per call. Deletions
  (the purge routine, the Spark archive, SQL by hand) change finished
  attempts and leave no other trace, so they show within that bound.
  ``queue_status(..., exact=True)`` counts every range again.

Each range is one grouped statement over a primary-key range. The counts
are also kept in the database, in ``<table>_status`` beside the queue
table (made by ``create_all()`` with it; ``__queue_status_table__ = False``
on the model goes without): a process's first call (a one-shot
``sqla-queue status``) reads them from there, with the same rules, instead
of counting every range again, and each call writes the ranges it counted,
in a short transaction of its own. Without the table, the first call of a
process counts every range.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    Engine,
    Integer,
    Table,
    Text,
    event,
    inspect,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapper

from ..common.identifiers import derived_identifier
from ..schema.mixins import QueueMixin

if TYPE_CHECKING:
    from ..adapters.inspection import InspectionQueries

__all__ = [
    "CHUNK_IDS",
    "STALE_SECONDS",
    "ClosedGroup",
    "closed_groups",
    "forget_all",
    "ranges_finished_since",
    "status_table",
]

#: ids per range
CHUNK_IDS = 65_536
#: a range counted longer ago than this is counted again
STALE_SECONDS = 300.0
#: at most this many stale ranges are counted again per call
STALE_PER_CALL = 4
#: the ranges counted, per database and queue table
_kept: dict[tuple[str, str | None, str], _Kept] = {}


class ClosedGroup(NamedTuple):
    """Finished attempts of one kind: ``recent`` of them finished in the window."""

    processo: str | None
    tenant: Any
    status: str
    dead: int
    requeued: int
    head: int
    cancelled: int  # 1: an operator's cancellation (a ``falha``)
    n: int
    recent: int


@dataclass
class _Range:
    open: int  # open attempts in the range when it was counted
    low: int | None  # its smallest finished id then
    finished: float | None  # its newest finished_at then (epoch seconds)
    at: float  # when it was counted (epoch seconds of the caller's clock)
    groups: list[ClosedGroup]  # its finished attempts then (recent: 0)


@dataclass
class _Kept:
    #: every range up to this one is in ``ranges`` or held nothing
    covered: int
    ranges: dict[int, _Range]


def closed_groups(
    conn: Connection,
    queries: InspectionQueries,
    *,
    since: dt.datetime,
    now: dt.datetime,
    exact: bool = False,
) -> list[ClosedGroup]:
    """The finished attempts by (processo, tenant, status, dead, requeued,
    head, cancelled), with how many finished at or after ``since`` (see the
    module)."""
    key = _key(conn, queries)
    store = _store_of(conn, queries.adapter.table, key)
    kept = None if exact else _kept.get(key)
    if kept is None and not exact and store is not None:
        kept = _load(conn, queries, store)
    # open counts first: a row that finishes after this read makes its range
    # differ next time, never the other way round
    open_counts = queries.open_by_range(conn, CHUNK_IDS)
    low, high = queries.id_bounds(conn)
    if low is None or high is None:
        _kept.pop(key, None)
        return []
    first, last = low // CHUNK_IDS, high // CHUNK_IDS
    since_epoch, now_epoch = since.timestamp(), now.timestamp()
    counted: dict[int, list[Any]] = {}  # range -> its rows, counted now
    reused: dict[int, _Range] = {}
    if kept is None:
        _count(conn, queries, counted, since, low, high)
    else:
        stale = sorted(
            (k for k, r in kept.ranges.items() if now_epoch - r.at > STALE_SECONDS),
            key=lambda k: kept.ranges[k].at,
        )[:STALE_PER_CALL]
        suspects = set(open_counts) | set(kept.ranges)
        dirty = []
        for k in sorted(k for k in suspects if first <= k <= kept.covered):
            r = kept.ranges.get(k)
            if (
                r is not None
                and k not in stale
                and r.open == open_counts.get(k, 0)
                and (k != first or r.low is None or r.low >= low)
                and (r.finished is None or r.finished < since_epoch)
            ):
                reused[k] = r
            else:
                dirty.append(k)
        if len(dirty) > len(reused):  # most ranges: one pass is cheaper
            reused.clear()
            _count(conn, queries, counted, since, low, high)
        else:
            for k in dirty:
                _count(conn, queries, counted, since, k * CHUNK_IDS, (k + 1) * CHUNK_IDS - 1)
            _count(conn, queries, counted, since, max(low, (kept.covered + 1) * CHUNK_IDS), high)
    found = [group for r in reused.values() for group in r.groups]
    covered = last - 2
    ranges = {k: r for k, r in reused.items() if k <= covered}
    for k in sorted(set(counted) | {k for k in open_counts if k <= covered}):
        rows = counted.get(k, [])
        found += (_group(r, r.recent) for r in rows)
        if k <= covered and k not in ranges:
            newest = [r.finished for r in rows if r.finished is not None]
            ranges[k] = _Range(
                open=open_counts.get(k, 0),
                low=min(int(r.low) for r in rows) if rows else None,
                finished=max(_epoch(value) for value in newest) if newest else None,
                at=now_epoch,
                groups=[_group(r, 0) for r in rows],
            )
    _kept[key] = _Kept(covered, ranges)
    if store is not None:
        engine, before = conn.engine, kept
        _pending[key] = lambda: _save(engine, queries, store, covered, ranges, now_epoch, before)
    return found


def ranges_finished_since(
    conn: Connection, queries: InspectionQueries, *, since: dt.datetime, now: dt.datetime
) -> list[tuple[int, int]]:
    """The id ranges (low, high) that may hold attempts finished at or
    after ``since``: those :func:`closed_groups` (called first, with the
    same rules) found a finish in, and the newest, not kept. Write the
    counts after with :func:`save_counted`. The dashboard's history reads
    only these instead of every finished attempt."""
    closed_groups(conn, queries, since=since, now=now)
    kept = _kept.get(_key(conn, queries))
    low, high = queries.id_bounds(conn)
    if kept is None or low is None or high is None:
        return []
    after = since.timestamp()
    found = [
        (k * CHUNK_IDS, (k + 1) * CHUNK_IDS - 1)
        for k, r in sorted(kept.ranges.items())
        if r.finished is not None and r.finished >= after
    ]
    return [*found, (max(low, (kept.covered + 1) * CHUNK_IDS), high)]


#: the counts a call will write once its reads are over (save_counted)
_pending: dict[tuple[str, str | None, str], Callable[[], None]] = {}


def save_counted(conn_or_engine: Any, queries: InspectionQueries, *, own: bool) -> None:
    """Write what the last :func:`closed_groups` of this queue counted, on a
    connection of its own, after the status's reads ended (``own``: the
    status had a connection of its own, now closed). A status read in the
    caller's transaction (a Session or Connection) on SQLite writes
    nothing: the database's one writer would wait for that transaction."""
    conn = conn_or_engine
    key = (conn.url.render_as_string(hide_password=True), *(_key_tail(queries)))
    pending = _pending.pop(key, None)
    if pending is not None and queries.writes_apart(conn, after_own_connection=own):
        pending()


def _group(row: Any, recent: int) -> ClosedGroup:
    """A row :meth:`InspectionQueries.closed_range` counted, as a group."""
    return ClosedGroup(
        row.processo,
        row.tenant,
        row.status,
        row.dead,
        row.requeued,
        row.head,
        row.cancelled,
        row.n,
        recent,
    )


def _count(
    conn: Connection,
    queries: InspectionQueries,
    counted: dict[int, list[Any]],
    since: dt.datetime,
    low: int,
    high: int,
) -> None:
    """Count the ids ``low`` to ``high`` into ``counted``, by range."""
    if low > high:
        return
    for row in queries.closed_range(conn, since=since, low=low, high=high, size=CHUNK_IDS):
        counted.setdefault(int(row.k), []).append(row)


def forget_all() -> None:
    """Drop every kept count (the next call of each queue counts every range)."""
    _kept.clear()


def _key(conn: Connection, queries: InspectionQueries) -> tuple[str, str | None, str]:
    """Which counts: the database (its URL without password) and the table."""
    return (conn.engine.url.render_as_string(hide_password=True), *_key_tail(queries))


def _key_tail(queries: InspectionQueries) -> tuple[str | None, str]:
    table = queries.adapter.table
    return table.schema, table.name


# ------------------------------------------------------------ the stored counts
#: per database and table: its <table>_status, or None when it has none
_stores: dict[tuple[str, str | None, str], Table | None] = {}
#: the row that holds ``covered`` (in ``low``) and the format (in ``open_count``)
_COVERED_ROW = -1
#: the format of the kept groups: 1, a ClosedGroup without ``recent``, as a
#: JSON list; 0 (before): without ``cancelled``, cancellations counted as
#: failed. Counts kept in another format are counted again, never read.
_FORMAT = 1


def status_table(table: Table) -> Table:
    """``<table>_status``: the finished attempts' counts per range of ids."""
    name = derived_identifier(table.name, "status", "")
    found = table.metadata.tables.get(f"{table.schema}.{name}" if table.schema else name)
    if found is not None:
        return found
    return Table(
        name,
        table.metadata,
        Column("range_id", BigInteger, primary_key=True, autoincrement=False),
        Column("open_count", Integer, nullable=False),
        Column("low", BigInteger),
        Column("finished", Double),
        Column("counted_at", Double, nullable=False),
        Column("groups_json", Text, nullable=False),
        schema=table.schema,
        info={"sqla_queue_status_of": table.name},
    )


@event.listens_for(QueueMixin, "after_mapper_constructed", propagate=True)
def _declare(mapper: Mapper[Any], cls: type[QueueMixin]) -> None:
    table = mapper.local_table
    if (
        isinstance(table, Table)
        and mapper.inherits is None
        and getattr(cls, "__queue_status_table__", True)
    ):
        status_table(table)


def _store_of(conn: Connection, table: Table, key: tuple[str, str | None, str]) -> Table | None:
    """The queue's ``<table>_status`` when the database has it (asked once
    per process and queue)."""
    if key not in _stores:
        store = status_table(table) if table.metadata is not None else None
        try:
            exists = store is not None and inspect(conn).has_table(store.name, schema=store.schema)
        except SQLAlchemyError:
            exists = False
        _stores[key] = store if exists else None
    return _stores[key]


def _load(conn: Connection, queries: InspectionQueries, store: Table) -> _Kept | None:
    ranges: dict[int, _Range] = {}
    covered = None
    for row in queries.counts_kept(conn, store=store):
        if row.range_id == _COVERED_ROW:
            if row.open_count != _FORMAT:
                return None  # another version's counts: count again
            covered = row.low
            continue
        try:
            groups = [ClosedGroup(*group, 0) for group in json.loads(row.groups_json)]  # type: ignore[call-arg]
        except (ValueError, TypeError):
            return None  # not what this version wrote: count again
        ranges[int(row.range_id)] = _Range(
            open=int(row.open_count),
            low=row.low,
            finished=row.finished,
            at=float(row.counted_at),
            groups=groups,
        )
    return None if covered is None else _Kept(int(covered), ranges)


def _save(
    engine: Engine,
    queries: InspectionQueries,
    store: Table,
    covered: int,
    ranges: dict[int, _Range],
    now_epoch: float,
    before: _Kept | None,
) -> None:
    """Write the ranges counted now and drop those gone, in a short
    transaction of its own (a status only reads in its caller's
    transaction, and a row lock held until the caller commits would stall
    every other status)."""
    old = before.ranges if before is not None else {}
    written = [k for k, r in ranges.items() if r.at == now_epoch or k not in old]
    dropped = [k for k in old if k not in ranges]
    if not written and not dropped and before is not None and before.covered == covered:
        return
    rows = [
        {
            "range_id": k,
            "open_count": ranges[k].open,
            "low": ranges[k].low,
            "finished": ranges[k].finished,
            "counted_at": ranges[k].at,
            "groups_json": json.dumps([list(g[:-1]) for g in ranges[k].groups]),
        }
        for k in written
    ]
    rows.append(
        {
            "range_id": _COVERED_ROW,
            "open_count": _FORMAT,
            "low": covered,
            "finished": None,
            "counted_at": now_epoch,
            "groups_json": "[]",
        }
    )
    try:
        with engine.connect() as own, own.begin():
            if before is None:
                # what the table holds is unknown (nothing read, or counts
                # of another format): every range not written now goes
                stored = (int(row.range_id) for row in queries.counts_kept(own, store=store))
                dropped = [k for k in stored if k not in ranges and k != _COVERED_ROW]
            ids = [*written, _COVERED_ROW, *dropped]  # the rows written and those gone
            queries.counts_keep(own, store=store, rows=rows, drop=ids)
    except SQLAlchemyError:
        pass  # another status wrote them meanwhile, or the table is not writable here


def _epoch(value: dt.datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)  # naive means UTC
    return value.timestamp()
