"""How idle lanes are woken: one at a time.

A notification (a NOTIFY, the queue server's message, the schedule
routine's promotion) means "there may be a task", not "every lane, claim
now": with one shared event, eight idle lanes all woke for each task and
seven of them ran an empty claim. On a table whose dead index entries
cannot be removed (a pinned vacuum horizon) every empty claim walks them
all, and those claims took the CPU the application's own enqueue needed.

So :meth:`LaneWakeup.set` wakes one waiting lane (or, when none waits, lets
the next lane that would wait go straight back to its claim); a lane whose
claim filled its batch wakes one more (``set``), so a backlog still brings
every lane in within a few claims; :meth:`set_all` wakes every lane (a
stop). The interface is ``threading.Event``'s (``set``, ``wait``,
``clear``, ``is_set``), so a listener or the schedule routine can be handed
either. :class:`AsyncLaneWakeup` is the same for the coroutine lanes of an
async worker (``aio.py``), which wait on their event loop and are woken
from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading

__all__ = ["AsyncLaneWakeup", "LaneWakeup"]


class LaneWakeup:
    """Wake-ups for ``lanes`` lanes: ``set()`` wakes one, ``set_all()`` all."""

    def __init__(self, lanes: int = 1) -> None:
        self.lanes = max(1, lanes)
        self._condition = threading.Condition(threading.Lock())
        # wake-ups not yet taken, at most one per lane: a burst of
        # notifications while every lane is busy is worth one claim each
        self._pending = 0
        #: lanes waiting for a wake-up now
        self.waiting = 0

    def set(self) -> None:
        """Wake one waiting lane, or the next one to wait."""
        with self._condition:
            if self._pending < self.lanes:
                self._pending += 1
            self._condition.notify()

    def set_all(self) -> None:
        """Wake every lane (a stop, a changed claim filter)."""
        with self._condition:
            self._pending = self.lanes
            self._condition.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a wake-up, at most ``timeout`` seconds; whether one came
        (False: the timeout, the fallback poll)."""
        with self._condition:
            if not self._pending:
                self.waiting += 1
                try:
                    self._condition.wait(timeout)
                finally:
                    self.waiting -= 1
            if self._pending:
                self._pending -= 1
                return True
            return False

    def clear(self) -> None:
        """Drop the wake-ups not yet taken."""
        with self._condition:
            self._pending = 0

    def is_set(self) -> bool:
        """Whether a wake-up is waiting to be taken."""
        return self._pending > 0


class AsyncLaneWakeup(LaneWakeup):
    """:class:`LaneWakeup` for lanes that are coroutines on one event loop:
    they wait with :meth:`wait_async`; ``set`` and ``set_all`` are called from
    any thread (the LISTEN thread, the routines, a signal handler)."""

    def __init__(self, lanes: int = 1) -> None:
        super().__init__(lanes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the lanes wait on (set when it starts)."""
        self._loop = loop

    def set(self) -> None:
        with self._condition:
            if self._pending < self.lanes:
                self._pending += 1
            self._condition.notify()
            self._wake(1)

    def set_all(self) -> None:
        with self._condition:
            self._pending = self.lanes
            self._condition.notify_all()
            self._wake(len(self._waiters))

    def _wake(self, count: int) -> None:
        """Resolve ``count`` waiting lanes' futures (the condition held)."""
        loop = self._loop
        for _ in range(min(count, len(self._waiters))):
            waiter = self._waiters.popleft()
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(_resolve, waiter)
                except RuntimeError:  # the loop has closed: nobody waits any more
                    return

    async def wait_async(self, timeout: float | None = None) -> bool:
        """:meth:`LaneWakeup.wait` for a coroutine lane."""
        with self._condition:
            if self._pending:
                self._pending -= 1
                return True
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self.waiting += 1
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            with self._condition:
                self.waiting -= 1
        with self._condition:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if self._pending:
                self._pending -= 1
                return True
            return False


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
