"""Rescue: ``processando`` tasks whose worker is gone get their retry.

A task is lost when its lease expired (every database) or, with per-task
locks, when no session holds its lock any more (PostgreSQL, MariaDB: the
worker died with its connection). Each lost task becomes
``falha_processando`` with the seed's message and gets its next attempt, or
its dead-letter run after the last one, in one transaction; the rows are
locked ``SKIP LOCKED`` (or updated only if their lease is unchanged), so two
rescuers, or a rescuer and a late heartbeat, never both win. The work itself
is ``TaskManager.rescue``, unchanged from when the runner called it.

Schedule: ``QUEUE_MINUTE_RETRY_THREAD`` when set (the seed's every 5
minutes), else every half lease (15 s by default), plus once when each
worker starts (lane 0, on every reconnect, as before).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from ..adapters import Adapter
from ..batch.manager import TaskManager
from ..config.ranges import Range
from ..config.timing import Schedule
from .base import Routine, RoutineResult

__all__ = ["RescueConfig", "RescueRoutine"]

RESCUE_LIMIT = Range(1, 100_000, integer=True)


@dataclass(frozen=True)
class RescueConfig:
    #: lost tasks re-enqueued per round, oldest first
    limit: int = 100

    def __post_init__(self) -> None:
        RESCUE_LIMIT.check("rescue limit", self.limit)


class RescueRoutine(Routine):
    name = "rescue"

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        schedule: Schedule,
        manager: TaskManager,
        config: RescueConfig | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule)
        self.manager = manager
        self.config = config or RescueConfig()

    def _round(self, dry_run: bool) -> RoutineResult:
        with self.adapter.connect_maintenance(self.engine) as conn:
            if dry_run:
                transaction = conn.begin()
                try:
                    lost = self.adapter.task_rescue_lost(conn, limit=self.config.limit)
                finally:
                    transaction.rollback()
                return RoutineResult(self.name, {"lost": len(lost)}, dry_run=True)
            rescued = self.manager.rescue(conn, limit=self.config.limit)
        return RoutineResult(self.name, {"rescued": rescued})
