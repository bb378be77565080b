"""Vacuum: ``VACUUM`` the queue table when its dead tuples pile up (PostgreSQL).

Every task leaves dead row versions behind (its claim, its completion, the
purge's delete), and each dead version keeps an entry in every index whose
predicate it met. Autovacuum clears them where it runs and keeps up; where
it does not (turned off, tuned for ordinary tables, or late), this routine
does: when the table's dead tuples pass ``vacuum_dead_tuples``, one worker
of the fleet (under the routine lock) runs ``VACUUM (ANALYZE, SKIP_LOCKED)``
on the queue table. The queue's speed does not depend on it (its plans read
indexes whatever the statistics: tests/adapters/test_plans.py); the table's size does.

A vacuum cannot remove what a running transaction may still see. When a
transaction older than ``HORIZON_BLOCK_SECONDS`` (or a replication slot, or
a prepared transaction) holds the cluster's oldest snapshot, a VACUUM would
read the whole table and free nothing: the routine skips it and logs a
WARNING naming the holder (its pid, state, application name and age; never
its query text, which may carry secrets), once per round.

Off PostgreSQL the routine does nothing: InnoDB purges its own old row
versions, and SQLite's freed pages are reused in place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Engine

from ..adapters import Adapter
from ..catalog import VACUUM_DEAD_TUPLES
from .base import Routine, RoutineResult
from .clock import Clock
from .timing import Schedule

__all__ = ["HORIZON_BLOCK_SECONDS", "VacuumConfig", "VacuumRoutine"]

logger = logging.getLogger("sqla_queue.maintenance")

#: a snapshot held this long is said to block the vacuum
HORIZON_BLOCK_SECONDS = 60.0


@dataclass(frozen=True)
class VacuumConfig:
    #: dead tuples that make a vacuum worth running; 0: never vacuum
    dead_tuples: int = 10_000
    #: a snapshot held this long blocks the vacuum
    horizon_seconds: float = HORIZON_BLOCK_SECONDS

    def __post_init__(self) -> None:
        VACUUM_DEAD_TUPLES.check("vacuum_dead_tuples", self.dead_tuples)


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

    def _round(self, dry_run: bool) -> RoutineResult:
        counts = {"dead_tuples": 0, "vacuumed": 0}
        if not self.config.dead_tuples or not self.adapter.supports_vacuum:
            return RoutineResult(self.name, counts, dry_run=dry_run)
        with self.adapter.connect_maintenance(self.engine) as conn:
            with conn.begin():
                state = self.adapter.table_vacuum_state(conn, self.config.horizon_seconds)
            counts["dead_tuples"] = state.dead_tuples
            if state.dead_tuples < self.config.dead_tuples:
                return RoutineResult(self.name, counts, dry_run=dry_run)
            if state.horizon_holder is not None:
                logger.warning(
                    "vacuum of %s skipped: %d dead tuples, and %s holds the oldest snapshot "
                    "(a vacuum could free none of them until it ends)",
                    self.adapter.qualified_name,
                    state.dead_tuples,
                    state.horizon_holder,
                )
                counts["blocked"] = 1
                return RoutineResult(self.name, counts, dry_run=dry_run)
            if not dry_run:
                self.adapter.table_vacuum(conn)
            counts["vacuumed"] = 1
        return RoutineResult(self.name, counts, dry_run=dry_run)
