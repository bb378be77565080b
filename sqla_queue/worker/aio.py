"""Async workers: coroutine handlers on an event loop, everything else shared.

A worker whose ``execute`` is ``async def`` (or whose ``@subscriber``
methods are) runs its lanes as coroutines on one event loop, in a thread of
its own; ``--concurrency N`` is N coroutine lanes. Each lane is the sync
worker's lane code (``runner.py``) run in a greenlet by SQLAlchemy's
``greenlet_spawn``, on connections of an ``AsyncEngine`` of its own (psycopg
3's async mode, aiomysql, aiosqlite: ``settings.make_async_engine``): their
statements suspend the greenlet while the driver awaits, so the loop runs
the other lanes meanwhile. The claim, the batch transaction, the savepoint
per task, the guarded ``sucesso``, retries and the dead letter, the hand-back
at a graceful stop and the recovery of a lost connection are therefore the
sync worker's code, not a second copy of it. What differs:

- the handler gets an ``AsyncSession`` that proxies the batch's Session (the
  same transaction and savepoint), and its coroutine is awaited on the loop:
  while one lane's handler awaits I/O, the other lanes' run;
- idle lanes wait for wake-ups on the loop (``AsyncLaneWakeup``), woken from
  the LISTEN thread, the routines and the signal handler;
- the handler returns its coroutine, which the time limit, the innermost
  middleware of the one list sync and async workers share (``pipeline.py``),
  awaits: past its limit it is cancelled; as the cancellation may land
  inside a statement, the batch's connection is given up, its failure
  recorded on a fresh one and its batch-mates handed back (the sync
  worker's path for a handler it had to abandon: ``timelimit.py``);
- a watchdog thread warns, naming the task, when one step of a handler
  holds the loop longer than ``blocking_warning_seconds`` (``time.sleep``,
  ``requests``, a CPU loop): every other lane waits meanwhile.

The heartbeat, the LISTEN thread, the maintenance routines and the signal
handlers stay threads on the worker's sync engine, exactly as for a sync
worker; sync and async workers share one table and one fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
import threading
import time
from types import FrameType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only, greenlet_spawn

from ..adapters.sqla_private import async_connection_of
from ..batch.manager import describe_traceback, task_label
from ..batch.transaction import Gate, LoopGate
from ..common.logs import task_fields
from ..schema.records import TaskRecord
from .app import QueueApp
from .runner import Runner
from .wakeup import AsyncLaneWakeup

__all__ = ["AsyncRunner", "LoopWatchdog", "async_view"]

logger = logging.getLogger("sqla_queue.worker")


class AsyncRunner(Runner):
    """The :class:`Runner` of a worker whose handlers are coroutines (see
    the module); ``WorkerBase.run()`` and the CLI choose it for such a worker."""

    lane_kind = "coroutine lane(s)"
    runs_coroutines = True

    def __init__(self, app: QueueApp, *, burst: bool = False) -> None:
        super().__init__(app, burst=burst)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    # ------------------------------------------------------------- the loop
    def _lane_threads(self) -> list[threading.Thread]:
        return [threading.Thread(target=self._run_loop, name="sqla-queue-loop")]

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._run_lanes())
        except BaseException as exc:  # the lanes catch their own: this is the loop's
            logger.error("the event loop crashed: %s", describe_traceback(exc))
            self._errors.append(exc)
            self.stop()

    async def _run_lanes(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._loop = loop
        if self.stopping.is_set():  # stopped before the loop could be told
            self._stopped.set()
        wake = self.wake
        assert isinstance(wake, AsyncLaneWakeup)
        wake.attach(loop)
        watchdog = LoopWatchdog(
            loop, threading.get_ident(), type(self.worker).blocking_warning_seconds
        )
        watchdog.start()
        commit_watch = asyncio.ensure_future(self.commit_watch.watch_async(self._stopped))
        try:
            await asyncio.gather(
                *(greenlet_spawn(self._lane, index) for index in range(self.concurrency))
            )
        finally:
            self._stopped.set()
            await commit_watch
            watchdog.stop()
            await self.worker.aclose_tenants()  # multi-database: on the loop that used them
            await self.app.async_engine.dispose()

    def stop(self) -> None:
        super().stop()
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stopped.set)

    def _gate(self) -> Gate:
        return LoopGate()

    def _start_commit_watch(self) -> None:
        pass  # a task on the loop (_run_lanes)

    # ---------------------------------------------- waits, in a lane's greenlet
    def _wait_for_wake(self, timeout: float) -> bool:
        wake = self.wake
        assert isinstance(wake, AsyncLaneWakeup)
        return bool(await_only(wake.wait_async(timeout)))

    def _pause(self, seconds: float) -> None:
        await_only(self._until_stopped(seconds))

    def _run_routine(self, name: str) -> Any:
        # on the worker's sync engine, in a thread: a routine that waits for
        # a lock (SQLite's write lock, held by a lane's batch) must not hold
        # the loop, which that lane needs to finish its batch
        return await_only(asyncio.to_thread(self.maintenance.run_now, name))

    async def _until_stopped(self, seconds: float) -> None:
        assert self._stopped is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    # ------------------------------------------------------------ handlers
    def _handle(self, task: TaskRecord, session: Session) -> Any:
        # the batch's Session (its savepoint, its transaction), seen through
        # an AsyncSession: the handler awaits its statements. Its bind is the
        # AsyncConnection of the batch's connection, so that session.bind and
        # get_bind() answer as on any AsyncSession (SQLAlchemy keeps one
        # proxy per connection: this finds the lane's own). The coroutine is
        # awaited by the time limit, the innermost middleware (timelimit.py)
        return self._call(task, async_view(session))

    async def _call(self, task: TaskRecord, session: AsyncSession) -> Any:
        # the watchdog finds the task it names in this frame (_running_task)
        result = self.worker.dispatch(task, session)  # type: ignore[arg-type]
        if inspect.isawaitable(result):
            result = await result
        return result


def async_view(session: Session) -> AsyncSession:
    """``session`` (a lane's batch Session, on a connection of an async
    engine) seen through an ``AsyncSession``: the same transaction and
    savepoint, its ``bind`` the ``AsyncConnection`` of that connection."""
    bind = async_connection_of(session.bind)
    return AsyncSession(bind, sync_session_class=_Given(session))  # type: ignore[arg-type]


class _Given:
    """``AsyncSession``'s ``sync_session_class``: hands it an existing Session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __call__(self, **_: Any) -> Session:
        return self.session


class LoopWatchdog:
    """Warns when the event loop of thread ``thread_id`` does not run a
    callback within ``threshold`` seconds: a step of a coroutine is holding
    it (a blocking call in an async handler). The warning names the task
    whose handler holds it, found in the loop thread's frames."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int, threshold: float) -> None:
        self.loop = loop
        self.thread_id = thread_id
        self.threshold = threshold
        self.interval = min(threshold / 2, 1.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="sqla-queue-loop-watchdog", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            answered = threading.Event()
            asked = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop has closed
                return
            if answered.wait(self.threshold):
                continue
            self._report(time.monotonic() - asked)
            while not answered.wait(self.interval):  # one warning a hold
                if self._stop.is_set():
                    return

    def _report(self, seconds: float) -> None:
        task = _running_task(sys._current_frames().get(self.thread_id))
        if task is None:
            logger.warning(
                "the event loop has been held for %.1f s by something that does not await "
                "(every coroutine lane waits meanwhile)",
                seconds,
            )
            return
        logger.warning(
            "%s has held the event loop for %.1f s without awaiting: an async handler "
            "must not block (time.sleep, requests, a long CPU loop): await, or use "
            "asyncio.to_thread; every other coroutine lane waits meanwhile",
            task_label(task),
            seconds,
            extra=task_fields(task),
        )


_CALL_CODE = AsyncRunner._call.__code__


def _running_task(frame: FrameType | None) -> TaskRecord | None:
    """The task whose handler ``frame`` (a thread's innermost) runs in."""
    while frame is not None:
        if frame.f_code is _CALL_CODE:
            found = frame.f_locals.get("task")
            return found if isinstance(found, TaskRecord) else None
        frame = frame.f_back
    return None
