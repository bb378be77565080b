"""The clock the maintenance schedules run on, and one tests can drive.

Schedules are evaluated on wall-clock time (UTC): a minute list or a cron
string names times of day, and every worker of a queue must agree on them.
:class:`SystemClock` is the real one; :class:`ManualClock` moves only when
a test says so, so a test of "once per slot" never sleeps.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Protocol

from ..common.types import utcnow

__all__ = ["Clock", "ManualClock", "SystemClock"]

#: the longest one wait lasts before the wall clock is read again (it may jump)
_RECHECK_SECONDS = 5.0


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, an aware UTC datetime."""
        ...

    def wait_until(self, when: dt.datetime, stop: threading.Event) -> bool:
        """Block until ``when`` or until ``stop`` is set; whether it was set."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return utcnow()

    def wait_until(self, when: dt.datetime, stop: threading.Event) -> bool:
        while True:
            left = (when - utcnow()).total_seconds()
            if left <= 0:
                return stop.is_set()
            if stop.wait(min(left, _RECHECK_SECONDS)):
                return True


class ManualClock:
    """A clock that stands still until :meth:`advance` or :meth:`set`."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
        self._changed = threading.Condition()
        self._stops: set[threading.Event] = set()

    def now(self) -> dt.datetime:
        with self._changed:
            return self._now

    def set(self, when: dt.datetime) -> None:
        with self._changed:
            self._now = when
            self._changed.notify_all()

    def advance(self, delta: dt.timedelta | float) -> dt.datetime:
        if not isinstance(delta, dt.timedelta):
            delta = dt.timedelta(seconds=delta)
        with self._changed:
            self._now += delta
            self._changed.notify_all()
            return self._now

    def wake(self) -> None:
        """Let waiters look at their stop events (call after setting one)."""
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, when: dt.datetime, stop: threading.Event) -> bool:
        with self._changed:
            while self._now < when and not stop.is_set():
                # a short timeout: a stop event set without wake() is seen anyway
                self._changed.wait(0.05)
            return stop.is_set()
