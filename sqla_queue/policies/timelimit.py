"""Time limits: a handler past its limit is abandoned, its work rolled back.

Python cannot kill a thread. A worker with a time limit therefore runs each
handler on a helper thread of its lane, and the lane waits for it at most
the task's limit. Past it, the lane:

1. cancels the statement the handler's connection is running, if any
   (PostgreSQL: the driver's cancel request; MySQL and MariaDB: ``KILL
   QUERY`` from another connection; SQLite: ``sqlite3_interrupt``);
2. raises :class:`HandlerInterrupted` inside the handler's thread (CPython's
   asynchronous exception): it surfaces at the handler's next Python
   instruction, or when the cancelled statement returns;
   The statements of the attempt's other connections (its tenant
   session's: docs/tenants.md) are cancelled the same way, and a tenant
   COMMIT can no longer start (see :class:`Attempt`);
3. waits a short grace period for the handler to stop. If it did, its
   savepoint is rolled back and the attempt fails with
   :class:`TimeLimitExceeded`, in the batch as any failure; the lane goes on
   with its next task. Where the cancelled statement took the whole
   transaction with it (SQLite rolls back the transaction of an interrupted
   write), the batch is over: as in step 4, the failure is recorded on a
   fresh connection and the batch's other tasks go back to ``pendente``.
4. If it did not (it is blocked in C code: ``time.sleep``, a socket read
   without a timeout, a C extension's loop), the lane abandons the thread
   *and* its database connection: the attempt's failure is recorded on a
   fresh connection, the batch's other tasks go back to ``pendente``, and
   the lane carries on with new connections and a new helper thread. The
   abandoned thread gets the exception when it returns to Python; its
   connection is closed under it, so nothing it does later commits.

What can and cannot be interrupted is in docs/lifecycle.md#time-limits.
Workers without a time limit run handlers on the lane itself, as before.

A worker whose handlers are coroutines (``worker/aio.py``, and the async
helpers of ``testing.py``) needs no thread: its handler returns a coroutine,
which the same :class:`TimeLimiter` (``coroutines=True``) awaits from the
lane's greenlet, and cancels past the limit (:func:`within`). As the
cancellation may land inside a statement, the batch's connection is then
given up (the manager records the failure on a fresh one and hands the
batch-mates back), as for an abandoned handler; not the caller's own
connection in ``testing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

from ..adapters.cancel import interrupt_ended_transaction, interrupt_statement, was_cancelled
from ..common.exceptions import SqlaQueueError
from ..common.logs import task_fields
from ..schema.records import TaskRecord
from .pipeline import Handler

__all__ = [
    "GRACE_SECONDS",
    "Attempt",
    "HandlerInterrupted",
    "TimeLimitExceeded",
    "TimeLimiter",
    "current_attempt",
    "within",
]

logger = logging.getLogger("sqla_queue.worker")

#: how long an interrupted handler has to stop before its thread is abandoned
GRACE_SECONDS = 2.0


class TimeLimitExceeded(SqlaQueueError):
    """The handler ran past its time limit and was abandoned."""


class HandlerInterrupted(BaseException):
    """Raised inside a handler past its time limit. A BaseException, so that
    a handler's ``except Exception`` does not swallow it."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` at its next Python instruction
    (None clears one that is still pending)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class Attempt:
    """One handler call under a time limit, as its other connections see it.

    A tenant session (``WorkerBase.tenant_session``) registers its
    connections here, so that the limit cancels their statements too, and
    commits through :meth:`committing`: once the limit has passed, no such
    COMMIT starts, and the lane does not record the attempt's failure while
    one is running. So a tenant transaction never commits after its
    attempt was recorded as failed (and the next attempt may have run)."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self.expired = False
        #: a COMMIT through committing() went through
        self.committed = False
        self.connections: list[Connection] = []

    def watch(self, conn: Connection) -> None:
        """Cancel ``conn``'s statement, too, when the limit passes."""
        self.connections.append(conn)

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Hold the block (the COMMIT) against the limit: raises
        :class:`HandlerInterrupted` instead once the limit has passed."""
        with self._gate:
            if self.expired:
                raise HandlerInterrupted()
            yield
            self.committed = True

    def expire(self, wait: float) -> bool:
        """Let no COMMIT start from now on. A COMMIT already running is
        waited for, ``wait`` seconds at most; whether none is running now."""
        if not self._gate.acquire(timeout=wait):
            return False
        self.expired = True
        self._gate.release()
        return True


_current = threading.local()


def current_attempt() -> Attempt | None:
    """The :class:`Attempt` of the handler this thread runs under a time
    limit (None: no limit)."""
    return getattr(_current, "attempt", None)


class _Job:
    __slots__ = ("args", "attempt", "done", "error", "function", "result")

    def __init__(self, function: Handler, args: tuple[TaskRecord, Session]) -> None:
        self.function = function
        self.args = args
        self.attempt = Attempt()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _HandlerThread:
    """One lane's helper thread: runs handlers handed to it, one at a time."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get()
                if job is None:
                    return
                _current.attempt = job.attempt
                try:
                    job.result = job.function(*job.args)
                except BaseException as exc:
                    job.error = exc
                finally:
                    _current.attempt = None
                    job.done.set()
            except HandlerInterrupted:  # landed between jobs: nothing to stop
                continue

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class TimeLimiter:
    """Runs handlers under their time limit (``limit_for(task)`` seconds;
    None: no limit): on helper threads, one per lane thread; or, with
    ``coroutines``, awaits the coroutine a handler returns, cancelled past
    its limit (see the module). ``give_up_connection``: past the limit, a
    coroutine's connection is invalidated (False: it is the caller's)."""

    def __init__(
        self,
        limit_for: Callable[[TaskRecord], float | None],
        *,
        grace_seconds: float = GRACE_SECONDS,
        coroutines: bool = False,
        give_up_connection: bool = True,
        describe: Callable[[TaskRecord], str] = lambda task: f"task {task.id}",
    ) -> None:
        self.limit_for = limit_for
        self.grace_seconds = grace_seconds
        self.coroutines = coroutines
        self.give_up_connection = give_up_connection
        self.describe = describe
        self._threads: dict[int, _HandlerThread] = {}
        self._mutex = threading.Lock()

    def wrap(self, handler: Handler, conn: Connection) -> Handler:
        if self.coroutines:
            return self._awaiting(handler)

        def limited(task: TaskRecord, session: Session) -> Any:
            limit = self.limit_for(task)
            if limit is None:
                return handler(task, session)
            return self._call(handler, task, session, limit, conn)

        return limited

    def _awaiting(self, handler: Handler) -> Handler:
        """``handler``, its coroutine awaited (from the calling greenlet)
        within the task's limit."""

        def limited(task: TaskRecord, session: Session) -> Any:
            result = handler(task, session)
            if not inspect.isawaitable(result):
                return result
            try:
                return await_only(
                    within(
                        result,
                        self.limit_for(task),
                        task,
                        grace_seconds=self.grace_seconds,
                        describe=self.describe,
                    )
                )
            except TimeLimitExceeded:
                # the cancellation may have landed inside a statement
                if self.give_up_connection:
                    with contextlib.suppress(Exception):
                        session.bind.invalidate()  # type: ignore[union-attr]
                raise

        return limited

    def close(self) -> None:
        with self._mutex:
            threads, self._threads = list(self._threads.values()), {}
        for helper in threads:
            helper.close()

    def _helper(self) -> _HandlerThread:
        lane = threading.get_ident()
        with self._mutex:
            helper = self._threads.get(lane)
            if helper is None:
                name = f"{threading.current_thread().name}-handler"
                helper = self._threads[lane] = _HandlerThread(name)
            return helper

    def _call(
        self, handler: Handler, task: TaskRecord, session: Session, limit: float, conn: Connection
    ) -> Any:
        helper = self._helper()
        job = _Job(handler, (task, session))
        helper.submit(job)
        if not job.done.wait(limit):
            ident = helper.thread.ident
            assert ident is not None
            attempt = job.attempt
            # no tenant COMMIT may start now; one that is running is waited
            # for (cancelled if it takes longer): it decides the attempt
            idle = attempt.expire(self.grace_seconds)
            if not idle:
                for other in list(attempt.connections):
                    interrupt_statement(other)
                idle = attempt.expire(self.grace_seconds)
            if attempt.committed and job.done.wait(self.grace_seconds):
                _raise_in(ident, None)
                return self._outcome(job)  # its tenant work committed: it stands
            if not idle:
                logger.error(
                    "task %s: a COMMIT of the handler's tenant session was still running "
                    "%g s after the time limit; its outcome is unknown",
                    task.id,
                    2 * self.grace_seconds,
                )
            interrupt_statement(conn)
            for other in list(attempt.connections):
                interrupt_statement(other)
            _raise_in(ident, HandlerInterrupted)
            stopped = job.done.wait(self.grace_seconds)
            if stopped:
                _raise_in(ident, None)  # it may have returned before the exception landed
            message = f"the handler ran past its time limit of {limit:g} s and was abandoned"
            if not stopped:
                # blocked in C: leave the thread and its connection behind
                with self._mutex:
                    self._threads.pop(threading.get_ident(), None)
                helper.close()
                logger.warning(
                    "task %s: the handler did not stop within %g s of its interruption; "
                    "its thread and connection are abandoned",
                    task.id,
                    self.grace_seconds,
                )
                for abandoned in (conn, *attempt.connections):
                    with contextlib.suppress(Exception):
                        abandoned.invalidate()
                raise TimeLimitExceeded(message)
            if interrupt_ended_transaction(conn):
                # nothing of the batch can commit now: hand it to the lost-
                # connection path (the failure recorded on a fresh connection)
                with contextlib.suppress(Exception):
                    conn.invalidate()
                raise TimeLimitExceeded(message)
            if job.error is None:
                return job.result  # it finished at the deadline: its work stands
            if isinstance(job.error, HandlerInterrupted) or was_cancelled(job.error):
                raise TimeLimitExceeded(message) from None
        return self._outcome(job)

    @staticmethod
    def _outcome(job: _Job) -> Any:
        if job.error is not None:
            if isinstance(job.error, HandlerInterrupted):
                # a limit that fired for an earlier call of this thread
                raise TimeLimitExceeded("the handler was interrupted") from None
            raise job.error
        return job.result


async def within(
    awaitable: Awaitable[Any],
    limit: float | None,
    task: TaskRecord,
    *,
    grace_seconds: float = GRACE_SECONDS,
    describe: Callable[[TaskRecord], str] = lambda task: f"task {task.id}",
) -> Any:
    """The result of ``awaitable`` (``task``'s handler), awaited ``limit``
    seconds at most (None: no limit); past it, cancelled, given
    ``grace_seconds`` to stop, and :class:`TimeLimitExceeded` raised."""
    if limit is None:
        return await awaitable
    running = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({running}, timeout=limit)
    if done:
        return running.result()
    running.cancel()
    await asyncio.wait({running}, timeout=grace_seconds)
    if not running.done():
        logger.warning(
            "%s: the handler did not stop within %g s of its cancellation; it is "
            "abandoned with its connection",
            describe(task),
            grace_seconds,
            extra=task_fields(task),
        )
    raise TimeLimitExceeded(f"the handler ran past its time limit of {limit:g} s and was cancelled")
