"""The commit watch: no finished task waits for a slow neighbour.

A lane runs its claim's tasks one after another and commits their outcomes
in groups (``sqla_queue/batch/transaction.py``). While one of its handlers runs, the
watch looks at the lane every quarter of the commit budget, through the
lane's gate (a lane busy with its connections is skipped):

- outcomes that have waited the budget are committed, provided the running
  handler has not touched the database (the transaction then holds only
  finished work; a handler that has touched it started a transaction of its
  own, with the others' outcomes committed before its first statement);
- once the running handler has run for the budget while another lane of
  the process is idle (or for ten budgets, for the other workers), the
  claim's tasks not started yet are handed back (``pendente``, a NOTIFY, an
  idle lane woken), so that idle lanes and other workers run them meanwhile.

Sync lanes are watched from a thread; coroutine lanes from a task on their
event loop, whose checks run in greenlets as the lanes' statements do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy.util import greenlet_spawn

from ..batch.manager import TaskManager
from ..batch.transaction import Lane
from ..common.redaction import describe_error

__all__ = ["CommitWatch"]

#: seconds without a batch after which the watch sleeps until the next one
#: (an idle worker's watch costs nothing; a busy one's lanes never wake it)
IDLE_AFTER = 1.0

logger = logging.getLogger("sqla_queue.worker")


class CommitWatch:
    """Watches ``lanes`` (see the module) for their manager."""

    def __init__(
        self,
        manager: TaskManager,
        lanes: Sequence[Lane],
        *,
        single_writer: bool,
        idle_lane: Callable[[], bool] = lambda: True,
    ) -> None:
        self.manager = manager
        self.lanes = list(lanes)
        self.budget = manager.commit_budget
        #: looks every quarter of the budget, at most every 5 ms
        self.interval = max(self.budget / 4, 0.005)
        #: SQLite: a handler that touched the database holds the write lock,
        #: which a hand-back would wait for
        self.single_writer = single_writer
        #: whether a lane of the process waits for work now
        self.idle_lane = idle_lane
        self._stop = threading.Event()
        self._active = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_active: asyncio.Event | None = None
        #: whether the watch sleeps until a lane begins a batch
        self._sleeping = False
        self._last_busy = 0.0

    # --------------------------------------------------------------- checks
    def busy(self) -> None:
        """A lane began a batch (called on the lane's thread, or for
        coroutine lanes on their loop): wake the watch if it sleeps. A watch
        that saw a batch within the last ``IDLE_AFTER`` seconds is looking
        already, and a lane that starts a batch then costs it nothing."""
        self._last_busy = time.monotonic()
        if self._sleeping:
            self._active.set()
            if self._loop_active is not None:
                self._loop_active.set()

    def _idle(self) -> bool:
        """No lane has run a batch for ``IDLE_AFTER`` seconds."""
        return not self._any_running() and time.monotonic() - self._last_busy > IDLE_AFTER

    def check(self, lane: Lane, now: float) -> None:
        """One look at ``lane``, its gate held."""
        task = lane.running
        if task is None or lane.work_conn is None:
            return
        if not lane.joined and lane.due(now):
            self.manager._flush(lane, False)
        if not lane.waiting or not lane.may_hand_back or (self.single_writer and lane.joined):
            return
        ran = now - lane.running_since
        if ran >= self.budget * 10 or (ran >= self.budget and self.idle_lane()):
            self.manager.hand_back_waiting(lane)

    def _any_running(self) -> bool:
        return any(lane.running is not None or lane.waiting for lane in self.lanes)

    # --------------------------------------------------------- sync lanes
    def start(self) -> None:
        if self.budget <= 0:
            return  # every outcome commits at once: nothing waits
        self._thread = threading.Thread(
            target=self._watch, name="sqla-queue-commit-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._active.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self._idle():
                self._sleeping = True
                self._active.clear()
                if self._idle():  # a batch that began meanwhile saw the watch awake
                    self._active.wait()
                self._sleeping = False
                continue
            if self._stop.wait(self.interval):
                return
            for lane in self.lanes:
                if not lane.gate.try_enter():
                    continue
                try:
                    self.check(lane, time.perf_counter())
                except Exception as exc:  # the lane sees its connection's state itself
                    logger.warning(
                        "lane %d: the commit watch failed: %s", lane.index, describe_error(exc)
                    )
                finally:
                    lane.gate.__exit__(None, None, None)

    # ---------------------------------------------------- coroutine lanes
    async def watch_async(self, stopped: asyncio.Event) -> None:
        """The watch of coroutine lanes, on their loop until ``stopped``."""
        if self.budget <= 0:
            return
        active = self._loop_active = asyncio.Event()
        while not stopped.is_set():
            if self._idle():
                self._sleeping = True
                active.clear()
                if self._idle():
                    await _first(stopped, active)
                self._sleeping = False
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), self.interval)
            for lane in self.lanes:
                if lane.running is None or not lane.gate.try_enter():
                    continue
                try:
                    await greenlet_spawn(self.check, lane, time.perf_counter())
                except Exception as exc:
                    logger.warning(
                        "lane %d: the commit watch failed: %s", lane.index, describe_error(exc)
                    )
                finally:
                    lane.gate.__exit__(None, None, None)


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
