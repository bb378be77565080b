"""What every routine has: a validated config, ``run_once()``, a schedule, a lock.

A routine is an object with a ``name`` (its lock's name too), a
``schedule`` and ``run_once(dry_run=False)``, which does one round on a
connection of its own and returns a :class:`RoutineResult` with its counts.
``run_once`` takes no lock: the scheduler (``scheduler.py``) takes the
routine's lock for the slot; ``sqla-queue maintenance run`` runs one now,
beside the workers, which every routine is written to survive.
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

from sqlalchemy import Engine

from ..adapters import Adapter
from ..common.progress import Progress, describe_counts
from ..config.timing import Schedule
from .clock import Clock, SystemClock

__all__ = ["Routine", "RoutineResult"]


@dataclass
class RoutineResult:
    routine: str
    #: what the round did, by name ("rescued", "deleted_rows", ...)
    counts: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0
    #: a one-line error that ended the round early (nothing after it was done)
    error: str | None = None

    def describe(self) -> str:
        """One line for logs and the command's output."""
        what = describe_counts(self.counts)
        head = f"{self.routine}{' (dry run)' if self.dry_run else ''}: {what or 'nothing to do'}"
        tail = f"; stopped: {self.error}" if self.error else ""
        return f"{head} in {self.seconds:.2f} s{tail}"


class Routine(abc.ABC):
    name: ClassVar[str]

    def __init__(
        self, engine: Engine, adapter: Adapter, schedule: Schedule, *, clock: Clock | None = None
    ) -> None:
        self.engine = engine
        self.adapter = adapter
        self.schedule = schedule
        #: the time ages are measured on (the purge's, the TTL's)
        self.clock = clock or SystemClock()
        self.queries = adapter.routines
        # one round at a time in this process (the start-up rescue and the
        # scheduled one share the routine), so it needs one connection at most
        self._running = threading.Lock()
        # the round's progress report (run_once's caller's; set under _running)
        self._progress: Progress | None = None

    def run_once(self, *, dry_run: bool = False, progress: Progress | None = None) -> RoutineResult:
        """One round now; ``dry_run`` counts what it would do and changes
        nothing; ``progress`` is told the round's counts after each chunk."""
        started = time.perf_counter()
        with self._running:
            self._progress = progress
            try:
                result = self._round(dry_run)
            finally:
                self._progress = None
        result.seconds = time.perf_counter() - started
        return result

    def _advanced(self, done: int, counts: dict[str, int]) -> None:
        """A chunk is done: ``done`` items of the round so far."""
        if self._progress is not None:
            self._progress(done, None, describe_counts(counts))

    @abc.abstractmethod
    def _round(self, dry_run: bool) -> RoutineResult: ...
