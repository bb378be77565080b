"""The worker loop: lanes (threads), wake-ups, signals, graceful stop.

Concurrency is threads, not asyncio: handlers are ordinary synchronous
SQLAlchemy code (the ORM Session they receive is the sync one, as in the
seed and in most applications), and the database drivers release the GIL
while they wait. Each lane is a thread with its own claim and work
connections; ``--concurrency N`` runs N lanes. For CPU-bound handlers run
more processes: workers share nothing but the database, so any number of
processes on any number of machines consume one queue with no central node.

Idle lanes wait to be woken, one lane per wake-up (``wakeup.py``): by the
PostgreSQL LISTEN thread when a task is enqueued (NOTIFY is delivered after
commit), by the schedule routine when it promotes due scheduled tasks, by a
lane whose claim filled its batch (there may be more), and otherwise by a
timeout: the fallback poll (a lost notification delays a task by seconds,
not forever), or the polling interval on databases without NOTIFY.

The first SIGTERM or SIGINT stops gracefully: running handlers finish, their
batch commits, and claimed tasks not yet started go back to ``pendente``.
A second signal exits at once; the database then rolls back the open
transaction, and the rescue re-enqueues those tasks when their per-task
locks die with the connections or, at the latest, their leases run out.
Nothing is lost either way.

A heartbeat thread renews the leases of the tasks the lanes hold (see
``leases.py``). The maintenance routines (rescue, schedule, purge, ttl) run
in threads of their own on their schedules (``maintenance/``); lane 0 also
runs the rescue when it (re)starts. A lane survives any loss of its
connections: it reconnects and carries on. Only errors that waiting cannot
fix (authentication, a missing database or table) stop the worker, with one
line that says which.

The parts the runner drives (engine, adapter, manager, stages, routines,
heartbeat, wake-ups) are built by :class:`~sqla_queue.worker.app.QueueApp`,
the composition root, and handed to the runner built:
``Runner(QueueApp(worker, engine=...), burst=True)``, or in one call
``Runner.for_worker(worker, engine=..., burst=True)``. Their settings come
from the worker class, the environment, the optional ``queue_configuration``
table and the defaults, in that order (``resolution.py``), resolved once
when the app is made.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import (
    DBAPIError,
    PendingRollbackError,
    ResourceClosedError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, configure_mappers

from ..adapters import Adapter, ErrorKind
from ..batch.manager import ConnectionLost, TaskManager, describe_traceback
from ..batch.transaction import Gate, Lane, ThreadGate
from ..client.pause import PAUSE_CHECK_SECONDS, paused_processes
from ..common.exceptions import ConfigurationError
from ..common.logs import set_worker_id
from ..common.redaction import describe_error
from ..config.resolution import Effective
from ..config.settings import Settings
from ..maintenance import Maintenance
from ..maintenance.clock import Clock
from ..policies.hooks import LANE_RECONNECTED, LaneEvent
from ..policies.leases import Heartbeat
from ..policies.timelimit import TimeLimitExceeded
from ..schema.records import TaskRecord
from .app import QueueApp
from .commitwatch import CommitWatch
from .contract import Worker
from .operator import describe as _describe
from .wakeup import LaneWakeup

logger = logging.getLogger("sqla_queue.worker")

RECONNECT_DELAY_SECONDS = 2.0
#: the most tasks a lane claims while another lane waits for work
SHARED_CLAIM = 1
LISTEN_READY_TIMEOUT_SECONDS = 10.0


class BatchLimit:
    """How many tasks the next claim asks for.

    Grows while batches finish well within ``target_seconds`` and shrinks to
    what fits in it, so quick tasks go by the hundred per commit and slow ones
    one at a time (a claimed task never waits long behind its batch-mates)."""

    def __init__(self, maximum: int, target_seconds: float) -> None:
        if maximum < 1:
            raise ConfigurationError(f"batch size must be at least 1, not {maximum}")
        self.maximum = maximum
        self.target_seconds = target_seconds
        self.value = 1

    def record(self, count: int, seconds: float) -> None:
        per_task = seconds / max(count, 1)
        # the nearest whole number of tasks ("about"): rounding down held
        # tasks a little over half the target (50 ms of I/O against 0.1 s)
        # to batches of one, each paying a batch's five round trips
        fits = round(self.target_seconds / per_task) if per_task > 0 else self.maximum
        grown = self.value * 2 if count >= self.value else self.value
        self.value = max(1, min(self.maximum, grown, fits))


#: the runners of this process while they run (the metrics' lane gauges)
_running: weakref.WeakSet[Runner] = weakref.WeakSet()


def lanes_of(queue: str) -> tuple[int, int]:
    """(lanes, lanes running a batch now) of this process's running workers
    of the queue table named ``queue``."""
    lanes = busy = 0
    for runner in list(_running):
        if runner.adapter.table.name == queue:
            lanes += runner.concurrency
            busy += sum(runner.busy)
    return lanes, busy


class Runner:
    """Runs a worker's lanes, heartbeat, wake-ups and signal handlers on the
    parts of a built :class:`~sqla_queue.worker.app.QueueApp`
    (:meth:`for_worker` builds one). ``run()`` returns when the worker
    stops: at a signal, in burst mode when no task is ready, or when
    another thread calls ``stop()``. ``burst``: stop once no task is ready."""

    def __init__(self, app: QueueApp, *, burst: bool = False) -> None:
        self._check_kind(app.worker)
        self.app = app
        self.burst = burst
        self.stopping = threading.Event()
        self._errors: list[BaseException] = []
        self._signals = 0
        self._trimmed = False
        #: the worker is its process (``_settle``): it runs in the main thread
        self._owns_process = False
        self.listener: Any = None
        #: per lane: whether it runs a batch now
        self.busy = [False] * app.concurrency
        #: per lane: its batch's state, shared with the commit watch (batching.py)
        self.lanes = [
            Lane(index, self._gate(), app.manager.commit_budget) for index in range(app.concurrency)
        ]
        self.commit_watch = CommitWatch(
            app.manager,
            self.lanes,
            single_writer=app.adapter.single_writer,
            idle_lane=self._spare,
        )
        for lane in self.lanes:
            lane.on_hand_back = self._handed_back
            lane.on_start = self.commit_watch.busy
        self._paused: frozenset[str] = frozenset()

    @classmethod
    def for_worker(
        cls,
        worker: Worker,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
        concurrency: int = 1,
        burst: bool = False,
        batch_size: int | None = None,
        commit_budget_ms: float | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
    ) -> Runner:
        """A runner of ``worker`` on a :class:`QueueApp` built from these
        arguments (see ``QueueApp``), the common case in one call."""
        cls._check_kind(worker)  # before the app: an async worker's makes an async engine
        app = QueueApp(
            worker,
            url=url,
            engine=engine,
            concurrency=concurrency,
            batch_size=batch_size,
            commit_budget_ms=commit_budget_ms,
            settings=settings,
            clock=clock,
        )
        return cls(app, burst=burst)

    # the parts the lanes use most, read from the app
    @property
    def worker(self) -> Worker:
        return self.app.worker

    @property
    def engine(self) -> Engine:
        return self.app.engine

    @property
    def lane_engine(self) -> Engine:
        """Where the lanes' claim and work connections come from."""
        return self.app.lane_engine

    @property
    def adapter(self) -> Adapter:
        return self.app.adapter

    @property
    def manager(self) -> TaskManager:
        return self.app.manager

    @property
    def effective(self) -> Effective:
        return self.app.effective

    @property
    def maintenance(self) -> Maintenance:
        return self.app.maintenance

    @property
    def heartbeat(self) -> Heartbeat:
        return self.app.heartbeat

    @property
    def wake(self) -> LaneWakeup:
        return self.app.wake

    @property
    def concurrency(self) -> int:
        return self.app.concurrency

    def _spare(self) -> bool:
        """Another lane waits for work: the process has capacity to spare
        (the commit watch's hand-backs: commitwatch.py)."""
        return self.wake.waiting > 0

    @classmethod
    def _check_kind(cls, worker: Worker) -> None:
        """Refuse a worker whose handlers are of the other kind."""
        is_async = type(worker).is_async()
        if is_async != cls.runs_coroutines:
            name = type(worker).__name__
            raise ConfigurationError(
                f"{name}'s handlers are coroutine functions: run it with "
                "sqla_queue.worker.AsyncRunner, or with its run()"
                if is_async
                else f"{name}'s handlers are not coroutine functions: run it with Runner"
            )

    # ----------------------------------------------------------------- run

    def run(self) -> int:
        self.app.check_table(wait_for_database=not self.burst)
        listener = None if self.burst else self.app.wakeups()
        if listener is not None:
            listener.start(self.wake)  # a queue server that refuses us stops the worker here
            ready = getattr(listener, "listening", None)
            # the queue server's client connects within start(); LISTEN's thread after it
            if ready is not None and not self.app.settings.server.enabled:
                ready.wait(LISTEN_READY_TIMEOUT_SECONDS)
        self.listener = listener
        _running.add(self)
        set_worker_id(self.app.worker_id)
        self._check_paused()  # before the first claim
        pauses = threading.Thread(target=self._watch_paused, name="sqla-queue-pause", daemon=True)
        pauses.start()
        self.heartbeat.start()
        if self.effective["maintenance"]:
            # a burst worker's lanes promote due tasks themselves before they
            # leave (_lane_loop): a schedule thread beside them could promote
            # one, still uncommitted, that a lane's promotion then skips
            self.maintenance.start(without=("schedule",) if self.burst else ())
        self._owns_process = threading.current_thread() is threading.main_thread()
        restore = self._install_signal_handlers()
        _configure_mappers()
        lanes = self._lane_threads()
        self._start_commit_watch()
        logger.info(
            "worker %s (%s): %d %s on %s (%s)%s",
            type(self.worker).__name__,
            self.app.worker_id,
            self.concurrency,
            self.lane_kind,
            self.adapter.qualified_name,
            self.engine.url.render_as_string(hide_password=True),
            ", burst" if self.burst else "",
        )
        unrouted = type(self.worker).unrouted_warning(self.adapter.qualified_name)
        if unrouted is not None:
            logger.warning(unrouted)
        try:
            for lane in lanes:
                lane.start()
            while any(lane.is_alive() for lane in lanes):
                for lane in lanes:
                    lane.join(timeout=0.5)
        finally:
            _running.discard(self)
            self.stop()
            self.commit_watch.stop()
            self.heartbeat.stop()
            if listener is not None:
                listener.stop()
            restore()
            self.app.close()
        if self._errors:
            error = self._errors[0]
            if isinstance(error, DBAPIError):
                raise self.app.database_error(error) from error
            raise error
        logger.info("worker %s stopped", type(self.worker).__name__)
        return 0

    def _watch_paused(self) -> None:
        while not self.stopping.wait(PAUSE_CHECK_SECONDS):
            self._check_paused()

    def _check_paused(self) -> None:
        """Read the paused processes (pause.py) and claim accordingly; a
        database error keeps the last known set."""
        try:
            with self.engine.connect() as conn:
                paused = paused_processes(conn, type(self.worker).queue_model())
        except Exception as exc:
            logger.debug("could not read the paused processes: %s", describe_error(exc))
            return
        if paused != self._paused:
            if paused:
                logger.info("paused processes (not claimed): %s", ", ".join(sorted(paused)))
            else:
                logger.info("no process is paused any more")
            self._paused = paused
            self.app.pause_claims(paused)
            self.wake.set_all()

    def stop(self) -> None:
        """Finish running tasks, hand back the rest, and return from run()."""
        self.stopping.set()
        self.wake.set_all()

    def _install_signal_handlers(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                logger.warning("second signal: exiting now; the rescue re-enqueues running tasks")
                os._exit(1)
            logger.info("signal %s: finishing running tasks, handing back the rest", signum)
            self.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]

    # ---------------------------------------------------------------- lanes
    #: what a lane is, for the start-up log line
    lane_kind = "lane(s)"
    #: whether the lanes await coroutine handlers (``aio.AsyncRunner``)
    runs_coroutines = False

    def _lane_threads(self) -> list[threading.Thread]:
        """The threads that run the lanes (here: one a lane)."""
        return [
            threading.Thread(target=self._lane, args=(i,), name=f"sqla-queue-lane-{i}")
            for i in range(self.concurrency)
        ]

    def _gate(self) -> Gate:
        """How a lane and the commit watch take turns (here: a lock)."""
        return ThreadGate()

    def _start_commit_watch(self) -> None:
        self.commit_watch.start()

    def _handed_back(self, count: int) -> None:
        """The commit watch handed ``count`` waiting tasks back: idle lanes look."""
        for _ in range(min(count, self.concurrency)):
            self.wake.set()

    def _wait_for_wake(self, timeout: float) -> bool:
        """An idle lane waits for a wake-up, ``timeout`` seconds at most."""
        return self.wake.wait(timeout)

    def _pause(self, seconds: float) -> None:
        """A lane waits ``seconds``, or until the worker stops."""
        self.stopping.wait(seconds)

    def _run_routine(self, name: str) -> Any:
        """Run maintenance routine ``name`` now, from a lane (a SlotRun)."""
        return self.maintenance.run_now(name)

    def _handle(self, task: TaskRecord, session: Session) -> Any:
        return self.worker.dispatch(task, session)

    def _lane(self, index: int) -> None:
        while not self.stopping.is_set():
            try:
                self._lane_loop(index)
                return
            except ConnectionLost as exc:
                cause = exc.__cause__
                if isinstance(cause, TimeLimitExceeded):
                    # its connection was left to the abandoned handler: new ones
                    logger.warning("lane %d: %s; new connections", index, describe_error(cause))
                    continue
                described = _describe(cause) if isinstance(cause, DBAPIError) else str(cause)
                self._reconnect(index, described)
            except DBAPIError as exc:
                kind = self.adapter.classify(exc)
                if kind is ErrorKind.TRANSIENT:
                    # a deadlock or a lock timeout: the batch was handed back
                    logger.warning("lane %d: %s; retrying", index, _describe(exc))
                    continue
                if self.burst or kind is not ErrorKind.DISCONNECT:
                    # a missing table, a permission, a refused login: waiting cannot help
                    self._errors.append(exc)
                    self.stop()
                    return
                self._reconnect(index, _describe(exc))
            except (PendingRollbackError, ResourceClosedError) as exc:
                # a statement on a connection that died under an earlier one
                self._reconnect(index, type(exc).__name__)
            except BaseException as exc:
                # frames and a one-line error: an exception's text may hold SQL
                logger.error("lane %d crashed: %s", index, describe_traceback(exc))
                self._errors.append(exc)
                self.stop()
                return

    def _reconnect(self, index: int, why: str) -> None:
        logger.warning("lane %d lost the database (%s); reconnecting", index, why)
        if self.app.hooks.wanted(LANE_RECONNECTED):
            self.app.hooks.emit([LaneEvent(LANE_RECONNECTED, index, why)])
        self._pause(RECONNECT_DELAY_SECONDS)

    def _lane_loop(self, index: int) -> None:
        limit = BatchLimit(self.app.batch_size, self.worker.batch_seconds)
        manager = self.manager
        #: burst: whether the due tasks were promoted since the last claim
        #: that found tasks, so that an empty claim now means none is ready
        promoted_since = False
        with (
            self.adapter.connect_claim(self.lane_engine) as claim_conn,
            self.lane_engine.connect() as work_conn,
            _invalidated_on_error(claim_conn),
            self._marked(work_conn, index),
        ):
            self.adapter.keep_lane_session(work_conn)
            manager.warm(work_conn)
            if index == 0:
                # as before the routines had threads: at start and after every
                # reconnect, whatever the schedule and the lock say
                self._run_routine("rescue")
            while not self.stopping.is_set():
                # while another lane waits for work, take one task: found, more
                # may wait, and the full claim wakes that lane; tasks that
                # arrive together then run side by side, none waiting behind
                # a neighbour in this lane (with two, a slow task's batch-mate
                # waited for its hand-back: docs/benchmarks.md); a lone task
                # costs two more claims, empty (the woken lane's, and this
                # lane's after it)
                batch = SHARED_CLAIM if self._spare() else limit.value
                tasks = manager.claim(claim_conn, limit=batch)
                if tasks:
                    promoted_since = False
                    full = len(tasks) >= batch or manager.claim_capped
                    if full:
                        self.wake.set()  # more may wait: one more lane looks
                    self.busy[index] = True
                    try:
                        result = manager.run_batch(
                            claim_conn,
                            work_conn,
                            tasks,
                            self._handle,
                            self.stopping.is_set,
                            lane=self.lanes[index],
                        )
                    finally:
                        self.busy[index] = False
                    limit.record(result.succeeded + result.failed, result.seconds)
                    if full or self.burst or not self._pushed():
                        continue  # claim again at once
                    # the claim took all there was: what arrived since has
                    # sent a wake-up (kept if no lane waited), so wait for it
                    # rather than run a claim that is most likely empty
                elif self.burst:
                    if not promoted_since:
                        # a due scheduled task is ready too: promote, then
                        # claim once more, whatever this promoted: another
                        # process may have promoted one since the claim
                        self._run_routine("schedule")
                        promoted_since = True
                        continue
                    retry_in = manager.claim_retry_in
                    if retry_in is None:
                        return
                    promoted_since = False
                    self._pause(retry_in)  # rate-limited tasks wait: their next token
                    continue
                if index == 0 and not self._trimmed:
                    self._trimmed = True
                    _settle(freeze=self._owns_process)
                retry_in = manager.claim_retry_in  # a rate limit's next token
                timeout = self._idle_timeout()
                self._wait_for_wake(timeout if retry_in is None else min(timeout, retry_in))

    @contextlib.contextmanager
    def _marked(self, conn: Connection, index: int) -> Iterator[None]:
        """``conn`` named as lane ``index``'s working session while the lane
        uses it, for another worker's rescue to end should this worker go
        silent (``Adapter.mark_session``; MariaDB)."""
        owner = self.manager.owner
        try:
            with conn.begin():
                self.adapter.mark_session(conn, owner=owner, slot=index)
        except SQLAlchemyError as exc:  # unmarked: the server's timeouts end it
            logger.debug("lane %d: session not marked: %s", index, describe_error(exc))
        try:
            yield
        finally:
            if not (conn.invalidated or conn.closed):
                with contextlib.suppress(SQLAlchemyError), conn.begin():
                    self.adapter.unmark_session(conn, owner=owner, slot=index)

    def _pushed(self) -> bool:
        """Whether wake-ups are pushed now (LISTEN, or the queue server,
        connected), rather than found by polling."""
        listening = getattr(self.listener, "listening", None)
        return listening is not None and bool(listening.is_set())

    def _idle_timeout(self) -> float:
        # the long fallback only while something will wake us: LISTEN, or the
        # queue server, connected; else (none, or lost) poll the database.
        # Due scheduled tasks: the schedule routine promotes them and sets
        # the wake event (and, on PostgreSQL, NOTIFYs the other workers)
        if self._pushed():
            return float(self.effective["wait_notify_interval"])
        return float(self.effective["poll_interval"])


@contextlib.contextmanager
def _invalidated_on_error(conn: Connection) -> Iterator[None]:
    """Close ``conn`` for good when the lane fails: its per-task and
    maintenance locks are session-level and would outlive a return to the
    pool, so the rescue could never take them."""
    try:
        yield
    except BaseException:
        conn.invalidate()
        raise


def _configure_mappers() -> None:
    """The application's ORM mappings made ready now, before the lanes
    start: the first handler to use the ORM would otherwise do it, while
    the other lanes wait for it (docs/lifecycle.md, "Warm lanes"). A mapping
    that cannot be configured fails its tasks, as it would have."""
    try:
        configure_mappers()
    except Exception as exc:  # the tasks report it, with their ids
        logger.warning("the ORM mappings could not be configured: %s", describe_error(exc))


#: whether this process froze its start-up objects (``_settle``)
_frozen = False


def _settle(*, freeze: bool) -> None:
    """Once, when the worker first goes idle: the C heap's free pages go back
    to the system (glibc would otherwise keep the few hundred kilobytes
    start-up leaves in an idle worker's RSS), and, in a worker that is its
    process (``freeze``: it runs in the main thread, as ``sqla-queue worker``
    does), what start-up made (imports, mappings, the first connections and
    statements) is collected and frozen (``gc.freeze``). A full collection
    stops every lane while it runs, and before the freeze each one scanned
    every object SQLAlchemy and the application had loaded (42-52 ms
    measured in the mixed benchmark's worker, about one per 3,000 tasks: a
    stall of every lane at once); frozen, they scan only what the worker
    made since. A worker inside an application's thread leaves the
    application's heap alone."""
    global _frozen
    if freeze and not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
        logger.debug("start-up objects frozen for the garbage collector: %d", gc.get_freeze_count())
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
