"""Vacuum: ``VACUUM`` the queue table when its dead tuples pile up (PostgreSQL).

Every task leaves dead row versions behind (its claim, its completion, the
purge's delete), and each dead version keeps an entry in every index whose
predicate it met. Autovacuum clears them where it runs and keeps up; where
it does not (turned off, tuned for ordinary tables, or late), this routine
does: when the table's dead tuples pass ``vacuum_dead_tuples``, one worker
of the fleet (under the routine lock) runs ``VACUUM (ANALYZE, SKIP_LOCKED)``
on the queue table. The queue's speed does not depend on it (its plans read
indexes whatever the statistics: tests/adapters/test_plans.py); the table's size does.

A vacuum cannot remove what a running transaction may still see, nor what
a transaction newer than the cluster's horizon deleted. The horizon is the
oldest of: every session's snapshot (``backend_xmin``) and transaction id
(``backend_xid``: a transaction that wrote holds it even with no snapshot,
idle in transaction in READ COMMITTED), the prepared transactions, the
replication slots' xmin and the standbys' (hot_standby_feedback). When one
of them has held it for more than ``HORIZON_BLOCK_SECONDS``, a VACUUM would
read the whole table and free none of the newer dead tuples: the routine
skips it and logs a WARNING naming the holder (its pid, state, application
name and age, the slot, the gid, the standby; never a query's text, which
may carry secrets), once per pin (later rounds of the same pin log at
DEBUG). A session's and a prepared transaction's age is a time PostgreSQL
gives; a slot's or a standby's is not, so the routine notes the next
transaction id at its rounds and ages them by it (:class:`_XidMarks`).

Off PostgreSQL the routine does nothing: InnoDB purges its own old row
versions, and SQLite's freed pages are reused in place.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from dataclasses import dataclass

from sqlalchemy import Engine

from ..adapters import Adapter
from ..adapters.base import HorizonHolder, VacuumState
from ..config.ranges import VACUUM_DEAD_TUPLES
from ..config.timing import Schedule
from .base import Routine, RoutineResult
from .clock import Clock

__all__ = ["HORIZON_BLOCK_SECONDS", "VacuumConfig", "VacuumRoutine"]

logger = logging.getLogger("sqla_queue.maintenance")

#: a snapshot held this long is said to block the vacuum
HORIZON_BLOCK_SECONDS = 60.0


@dataclass(frozen=True)
class VacuumConfig:
    #: dead tuples that make a vacuum worth running; 0: never vacuum
    dead_tuples: int = 10_000
    #: a horizon held this long blocks the vacuum; 0: any holder does
    horizon_seconds: float = HORIZON_BLOCK_SECONDS

    def __post_init__(self) -> None:
        VACUUM_DEAD_TUPLES.check("vacuum_dead_tuples", self.dead_tuples)


class _XidMarks:
    """The next transaction id seen at past rounds, and when: how long a slot
    or a standby, which carry no time, has held the horizon. One whose xmin
    precedes the id noted ``horizon_seconds`` ago has held it at least that
    long. Ids are 64 bits wide here (txid_current_snapshot), so the count
    of transactions since a mark never wraps."""

    def __init__(self) -> None:
        self._marks: deque[tuple[dt.datetime, int]] = deque()

    def since(self, when: dt.datetime, next_xid: int) -> int | None:
        """Transactions begun since ``when`` (at least: the newest mark at or
        before it); None when no round was that long ago."""
        while len(self._marks) > 1 and self._marks[1][0] <= when:
            self._marks.popleft()  # a newer mark is old enough: the older one is no longer needed
        if self._marks and self._marks[0][0] <= when:
            return next_xid - self._marks[0][1]
        return None

    def note(self, now: dt.datetime, next_xid: int, spacing: dt.timedelta) -> None:
        # a mark every ``spacing`` at most: as many as rounds in a horizon, bounded
        if not self._marks or now - self._marks[-1][0] >= spacing:
            self._marks.append((now, next_xid))


class VacuumRoutine(Routine):
    name = "vacuum"

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        schedule: Schedule,
        config: VacuumConfig | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule, clock=clock)
        self.config = config or VacuumConfig()
        self._marks = _XidMarks()
        # the pin last warned of, while it holds (None: none, or it let go)
        self._warned: str | None = None

    def _round(self, dry_run: bool) -> RoutineResult:
        counts = {"dead_tuples": 0, "vacuumed": 0}
        if not self.config.dead_tuples or not self.adapter.supports_vacuum:
            return RoutineResult(self.name, counts, dry_run=dry_run)
        with self.adapter.connect_maintenance(self.engine) as conn:
            with conn.begin():
                state = self.adapter.table_vacuum_state(conn, self.config.horizon_seconds)
            holder = self._holder(state)
            counts["dead_tuples"] = state.dead_tuples
            if state.dead_tuples < self.config.dead_tuples:
                return RoutineResult(self.name, counts, dry_run=dry_run)
            if holder is not None:
                self._warn(holder, state.dead_tuples)
                counts["blocked"] = 1
                return RoutineResult(self.name, counts, dry_run=dry_run)
            if not dry_run:
                self.adapter.table_vacuum(conn)
            counts["vacuumed"] = 1
        return RoutineResult(self.name, counts, dry_run=dry_run)

    def _holder(self, state: VacuumState) -> HorizonHolder | None:
        """The oldest holder that has held the horizon ``horizon_seconds``
        (the adapter gives only those for the holders with a time), and
        note this round's transaction id."""
        seconds = self.config.horizon_seconds
        since: int | None = 0  # a horizon of 0 s: any holder
        if seconds > 0:
            now = self.clock.now()
            since = self._marks.since(now - dt.timedelta(seconds=seconds), state.next_xid)
            self._marks.note(now, state.next_xid, dt.timedelta(seconds=seconds / 16))
        for holder in state.holders:
            if holder.seconds is not None or (since is not None and holder.xids > since):
                return holder
        self._warned = None
        return None

    def _warn(self, holder: HorizonHolder, dead_tuples: int) -> None:
        again = holder.pin == self._warned
        self._warned = holder.pin
        logger.log(
            logging.DEBUG if again else logging.WARNING,
            "vacuum of %s skipped: %d dead tuples, and %s holds the vacuum horizon "
            "(a vacuum could free none of the newer ones until it lets go)",
            self.adapter.qualified_name,
            dead_tuples,
            holder.what,
        )
