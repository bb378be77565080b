"""Runs each routine on its schedule, once per slot across the workers.

Every worker process runs one thread per routine. At each fire time of the
routine's schedule (a new *slot*), the thread gives back the routine's lock
if it held it for the previous slot, then tries to take it: the worker that
gets it runs the routine, and **keeps the lock until the next slot
begins**. The others, trying for this slot a moment later (their clocks
differ a little), find it taken and skip it. So with a lock that is
exclusive, a routine runs once per slot however many workers race for it;
a worker that dies frees the lock with its connection, and the next slot
is run by another. A worker does not run the slot in progress when it
starts (a minute list means those minutes); the runner's start-up rescue is
apart from this.

The threads wait on an injectable :class:`~.clock.Clock`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..redaction import describe_error
from .base import Routine, RoutineResult
from .clock import Clock, SystemClock
from .lock import RoutineLock

__all__ = ["Maintenance", "SlotRun"]

logger = logging.getLogger("sqla_queue.maintenance")


@dataclass(frozen=True)
class SlotRun:
    routine: str
    slot: dt.datetime
    result: RoutineResult


class Maintenance:
    """A worker's routines and the threads that run them."""

    def __init__(
        self,
        routines: Iterable[Routine],
        lock: RoutineLock,
        *,
        clock: Clock | None = None,
        on_result: Callable[[SlotRun], None] | None = None,
    ) -> None:
        self.routines = {routine.name: routine for routine in routines}
        self.lock = lock
        self.clock = clock or SystemClock()
        self.on_result = on_result
        #: the latest runs of this worker (newest last)
        self.history: deque[SlotRun] = deque(maxlen=1000)
        self._considered: dict[str, dt.datetime] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def routine(self, name: str) -> Routine:
        try:
            return self.routines[name]
        except KeyError:
            known = ", ".join(sorted(self.routines))
            raise KeyError(f"no routine {name!r} (routines: {known})") from None

    def run_now(self, name: str, *, dry_run: bool = False) -> RoutineResult:
        """One round of ``name`` now, without its lock (routines survive
        running beside another worker's round)."""
        return self.routine(name).run_once(dry_run=dry_run)

    # ------------------------------------------------------------ threads
    def start(self) -> None:
        self._stop.clear()
        for routine in self.routines.values():
            thread = threading.Thread(
                target=self._loop, args=(routine,), name=f"sqla-queue-{routine.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        wake = getattr(self.clock, "wake", None)
        if wake is not None:
            wake()
        for thread in self._threads:
            thread.join(timeout=timeout)
        self._threads.clear()
        close = getattr(self.lock, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    def considered(self, name: str) -> dt.datetime | None:
        """The latest slot this worker's ``name`` thread has dealt with."""
        with self._changed:
            return self._considered.get(name)

    def _loop(self, routine: Routine) -> None:
        name, schedule = routine.name, routine.schedule
        last = schedule.slot_at(self.clock.now())
        holding = False
        try:
            while not self.clock.wait_until(schedule.next_after(last), self._stop):
                slot = schedule.slot_at(self.clock.now())
                if slot <= last:  # the clock went back: wait for the slot after
                    continue
                last = slot
                if holding:
                    self.lock.release(name)
                    holding = False
                if self.lock.try_acquire(name):
                    holding = True
                    self._run(routine, slot)
                with self._changed:
                    self._considered[name] = slot
                    self._changed.notify_all()
        finally:
            if holding:
                with contextlib.suppress(Exception):
                    self.lock.release(name)

    def _run(self, routine: Routine, slot: dt.datetime) -> None:
        try:
            result = routine.run_once()
        except Exception as exc:  # the database is away: the next slot tries again
            error = describe_error(exc)
            logger.warning("maintenance %s failed: %s", routine.name, error)
            result = RoutineResult(routine.name, error=error)
        else:
            if result.error:
                logger.warning("maintenance %s", result.describe())
            elif any(result.counts.values()) and routine.name != "schedule":
                logger.info("maintenance %s", result.describe())
        run = SlotRun(routine.name, slot, result)
        self.history.append(run)
        if self.on_result is not None:
            self.on_result(run)
