"""Maintenance routines: rescue, schedule, purge, ttl, vacuum, and the
application's periodic tasks; one module each.

Every worker runs them (there is no central node): each routine on its
schedule, in a thread of its own, with a connection of its own, and only
one worker of a queue runs a routine in a given slot (``scheduler.py``,
under the lock of ``lock.py``). ``build_routines`` makes a worker's five
from its effective settings (``catalog.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Engine, Table

from ..adapters import Adapter
from ..adapters.limits import RateBuckets
from ..batch.manager import TaskManager
from ..config.resolution import Effective
from ..config.timing import Every, Schedule
from ..policies.leases import LeasePolicy
from .base import Routine, RoutineResult
from .clock import Clock, ManualClock, SystemClock
from .lock import RoutineLock, routine_lock_for
from .periodic import Periodic, PeriodicRoutine
from .purge import BeforeDelete, PurgeConfig, PurgeRoutine
from .rescue import RescueConfig, RescueRoutine
from .schedule import ScheduleConfig, ScheduleRoutine
from .scheduler import Maintenance, SlotRun
from .ttl import TtlConfig, TtlRoutine
from .vacuum import VacuumConfig, VacuumRoutine

__all__ = [
    "ROUTINES",
    "BeforeDelete",
    "Clock",
    "Maintenance",
    "ManualClock",
    "Periodic",
    "PeriodicRoutine",
    "PurgeConfig",
    "PurgeRoutine",
    "RescueConfig",
    "RescueRoutine",
    "Routine",
    "RoutineLock",
    "RoutineResult",
    "ScheduleConfig",
    "ScheduleRoutine",
    "SlotRun",
    "SystemClock",
    "TtlConfig",
    "TtlRoutine",
    "VacuumConfig",
    "VacuumRoutine",
    "build_routines",
    "routine_lock_for",
]

ROUTINES = ("rescue", "schedule", "purge", "ttl", "vacuum", "periodic")


def build_routines(
    engine: Engine,
    adapter: Adapter,
    manager: TaskManager,
    effective: Effective,
    *,
    lease: LeasePolicy,
    wake: Callable[[], None] | None = None,
    clock: Clock | None = None,
    before_delete: BeforeDelete | None = None,
    periodic: Sequence[Periodic] = (),
    markers: Table | None = None,
    buckets: RateBuckets | None = None,
) -> list[Routine]:
    """The routines of a worker: the five of the seed and PEQ, and the
    periodic tasks' when it declares any (``markers``: the configuration
    table that keeps their last occurrences); ``buckets``: its rate limits'
    token buckets, whose full ones the purge deletes."""
    clock = clock or SystemClock()
    rescue_schedule: Schedule = effective["rescue_schedule"] or Every(lease.rescue_every_seconds)
    routines: list[Routine] = [
        RescueRoutine(engine, adapter, rescue_schedule, manager),
        ScheduleRoutine(
            engine,
            adapter,
            effective["schedule_schedule"],
            ScheduleConfig(wait_notify_seconds=effective["wait_notify_interval"]),
            wake=wake,
            clock=clock,
        ),
        PurgeRoutine(
            engine,
            adapter,
            effective["purge_schedule"],
            PurgeConfig(
                max_age_days=effective["purge_max_age"],
                dead_letter_max_age_days=effective["dead_letter_retention"],
                limit=effective["purge_limit"],
                rounds=effective["purge_round_limit"],
                before_delete=before_delete,
            ),
            clock=clock,
            buckets=buckets,
        ),
        TtlRoutine(
            engine,
            adapter,
            effective["ttl_schedule"],
            TtlConfig(ttl_minutes=effective["item_ttl"]),
            clock=clock,
        ),
        VacuumRoutine(
            engine,
            adapter,
            effective["vacuum_schedule"],
            VacuumConfig(dead_tuples=int(effective["vacuum_dead_tuples"])),
            clock=clock,
        ),
    ]
    if periodic:
        assert markers is not None
        routines.append(PeriodicRoutine(engine, adapter, periodic, markers, wake=wake, clock=clock))
    return routines
