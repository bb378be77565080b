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

Each range is one grouped statement over a primary-key range. The first
call of a process counts every range; a one-shot ``sqla-queue status``
always does, so it is always exact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection

if TYPE_CHECKING:
    from .adapters.inspection import InspectionQueries

__all__ = ["CHUNK_IDS", "STALE_SECONDS", "ClosedGroup", "closed_groups", "forget_all"]

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
    head), with how many finished at or after ``since`` (see the module)."""
    key = _key(conn, queries)
    kept = None if exact else _kept.get(key)
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
        found += (
            ClosedGroup(r.processo, r.tenant, r.status, r.dead, r.requeued, r.head, r.n, r.recent)
            for r in rows
        )
        if k <= covered and k not in ranges:
            newest = [r.finished for r in rows if r.finished is not None]
            ranges[k] = _Range(
                open=open_counts.get(k, 0),
                low=min(int(r.low) for r in rows) if rows else None,
                finished=max(_epoch(value) for value in newest) if newest else None,
                at=now_epoch,
                groups=[
                    ClosedGroup(r.processo, r.tenant, r.status, r.dead, r.requeued, r.head, r.n, 0)
                    for r in rows
                ],
            )
    _kept[key] = _Kept(covered, ranges)
    return found


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
    table = queries.adapter.table
    return (conn.engine.url.render_as_string(hide_password=True), table.schema, table.name)


def _epoch(value: dt.datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)  # naive means UTC
    return value.timestamp()
