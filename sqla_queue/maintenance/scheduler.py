"""Runs each routine on its schedule, once per slot across the workers.

Every worker process runs one thread per routine. At each fire time of the
routine's schedule (a new *slot*), the thread gives back the routine's lock
if it held it for the previous slot, then tries to take it: the worker that
gets it runs the routine, and **keeps the lock until the next slot
begins**. The others, trying for this slot a moment later (their clocks
differ a little), find it taken and skip it. So with a lock that is
exclusive, a routine runs once per slot however many workers race for it;
a worker that dies frees the lock with its connection, and the next slot
is run by another. A lock that says ``held_between_runs = False`` (the
lease of a transaction-pooled PostgreSQL: adapters/locks.py) is given back
right after the run instead, and a slot may then rarely run twice, which
every routine survives. A worker does not run the slot in progress when it
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

from ..common.progress import Progress
from ..common.redaction import describe_error
from .base import Routine, RoutineResult
from .clock import Clock, SystemClock
from .lock import RoutineLock

__all__ = ["Maintenance", "SlotRun"]

logger = logging.getLogger("sqla_queue.maintenance")

#: after an unexpected error in a routine's thread, it waits this long
ERROR_PAUSE_SECONDS = 5.0


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

    def run_now(
        self, name: str, *, dry_run: bool = False, progress: Progress | None = None
    ) -> RoutineResult:
        """One round of ``name`` now, without its lock (routines survive
        running beside another worker's round); ``progress``: see
        :mod:`sqla_queue.common.progress`."""
        return self.routine(name).run_once(dry_run=dry_run, progress=progress)

    # ------------------------------------------------------------ threads
    def start(self, *, without: Iterable[str] = ()) -> None:
        """A thread for each routine but those named in ``without``."""
        self._stop.clear()
        skipped = set(without)
        for routine in self.routines.values():
            if routine.name in skipped:
                continue
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
        """One routine's thread. No error ends it, only :meth:`stop`: a lock
        that fails (the database or the queue server away, a server that
        refuses this worker) grants nothing and the routine skips the slot;
        any other error is logged and the next slot tries again."""
        name, schedule = routine.name, routine.schedule
        last = schedule.slot_at(self.clock.now())
        holding = False
        try:
            while not self._stop.is_set():
                try:
                    if self.clock.wait_until(schedule.next_after(last), self._stop):
                        break
                    slot = schedule.slot_at(self.clock.now())
                    if slot <= last:  # the clock went back: wait for the slot after
                        continue
                    last = slot
                    holding = self._turn(routine, slot, holding)
                except Exception as exc:  # a bug of ours, most likely: not the thread's end
                    logger.error(
                        "maintenance %s: unexpected %s; trying again in %g s",
                        name,
                        describe_error(exc),
                        ERROR_PAUSE_SECONDS,
                    )
                    if self._stop.wait(ERROR_PAUSE_SECONDS):
                        break
        finally:
            if holding:
                self._release(name)

    def _turn(self, routine: Routine, slot: dt.datetime, holding: bool) -> bool:
        """The slot's turn: the last slot's lock given back, this one's
        taken and the routine run if it was; whether the lock is held."""
        if holding:
            self._release(routine.name)
            holding = False
        try:
            holding = self.lock.try_acquire(routine.name)
        except Exception as exc:  # a lock must say False, but one that raises is no lock
            logger.warning("routine lock %s not taken: %s", routine.name, describe_error(exc))
        if holding:
            self._run(routine, slot)
            if not getattr(self.lock, "held_between_runs", True):
                # a lock that pins a pooled connection while held: given
                # back at once (the routines survive a second run of a slot)
                self._release(routine.name)
                holding = False
        with self._changed:
            self._considered[routine.name] = slot
            self._changed.notify_all()
        return holding

    def _release(self, name: str) -> None:
        try:
            self.lock.release(name)
        except Exception as exc:  # the lock dies with its connection anyway
            logger.warning("routine lock %s not released: %s", name, describe_error(exc))

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
            try:
                self.on_result(run)
            except Exception as exc:
                logger.warning(
                    "maintenance %s: on_result failed: %s", routine.name, describe_error(exc)
                )
