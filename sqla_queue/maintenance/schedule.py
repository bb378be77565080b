"""Schedule: due ``agendada`` tasks become ``pendente``, and workers wake.

A round promotes due rows in chunks (``FOR UPDATE SKIP LOCKED`` where the
database can: a row an application transaction holds waits for the next
round instead of stalling this one), then wakes the workers: this process's
lanes at once, and on PostgreSQL every worker of the queue with a NOTIFY.
It also re-notifies when a ``pendente`` task has waited longer than
``QUEUE_WAIT_NOTIFY_INTERVAL`` (a notification was lost, or no worker was
listening when it came): the seed's notify thread did both.

Schedule: ``QUEUE_MINUTE_NOTIFY_THREAD`` when set (the seed's every 5
minutes), else every second, so a scheduled task or a retry runs within
about a second of its time (idle lanes also wake when the earliest one is
due).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine

from ..adapters import Adapter
from ..adapters.base import PROMOTE_CHUNK
from ..config.ranges import WAIT_SECONDS, Range
from ..config.timing import Schedule
from .base import Routine, RoutineResult
from .clock import Clock

__all__ = ["ScheduleConfig", "ScheduleRoutine"]

PROMOTE_ROUNDS = Range(1, 10_000, integer=True)


@dataclass(frozen=True)
class ScheduleConfig:
    #: a pendente task older than this (seconds) is re-notified
    wait_notify_seconds: float = 5.0
    #: chunks of PROMOTE_CHUNK rows promoted per round at most
    max_chunks: int = 100

    def __post_init__(self) -> None:
        WAIT_SECONDS.check("QUEUE_WAIT_NOTIFY_INTERVAL", self.wait_notify_seconds)
        PROMOTE_ROUNDS.check("schedule max_chunks", self.max_chunks)


class ScheduleRoutine(Routine):
    name = "schedule"

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        schedule: Schedule,
        config: ScheduleConfig | None = None,
        *,
        wake: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule, clock=clock)
        self.config = config or ScheduleConfig()
        self.wake = wake

    def _round(self, dry_run: bool) -> RoutineResult:
        promoted = 0
        before = self.clock.now() - dt.timedelta(seconds=self.config.wait_notify_seconds)
        with self.adapter.connect_maintenance(self.engine) as conn:
            if dry_run:
                transaction = conn.begin()
                try:
                    due = self.adapter.task_promote_due(conn)
                    stale = self.queries.pending_stale_exists(conn, before=before)
                finally:
                    transaction.rollback()
                counts = {"due": due, "stale_pending": int(stale)}
                return RoutineResult(self.name, counts, dry_run=True)
            stale = False
            for _ in range(self.config.max_chunks):
                with conn.begin():  # one transaction a round when little is due
                    chunk = self.adapter.task_promote_due(conn)
                    promoted += chunk
                    last = chunk < PROMOTE_CHUNK
                    if last and not promoted:
                        stale = self.queries.pending_stale_exists(conn, before=before)
                    if last and (promoted or stale) and self.adapter.supports_notify:
                        self.adapter.notify(conn)
                self._advanced(promoted, {"promoted": promoted})
                if last:
                    break
            else:  # the round's chunks ran out with rows still due: wake anyway
                if self.adapter.supports_notify:
                    with conn.begin():
                        self.adapter.notify(conn)
        if (promoted or stale) and self.wake is not None:
            self.wake()
        return RoutineResult(self.name, {"promoted": promoted, "renotified": int(bool(stale))})
