"""The routine lock: only one worker of a queue runs a routine at a time.

The lock implementations are the adapters' (``sqla_queue.adapters.locks``);
:func:`routine_lock_for` is the one place a worker gets its lock from (the
queue server's plugs in before it: ``worker/app.py``).
"""

from __future__ import annotations

from sqlalchemy import Engine

from ..adapters import Adapter
from ..adapters.locks import RoutineLock

__all__ = ["RoutineLock", "routine_lock_for"]


def routine_lock_for(engine: Engine, adapter: Adapter) -> RoutineLock:
    """The lock a worker's routines use on this database (its adapter's)."""
    lock: RoutineLock = adapter.routine_lock(engine)
    return lock
