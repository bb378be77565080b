"""The worker loop: lanes (threads), wake-ups, signals, graceful stop.

Concurrency is threads, not asyncio: handlers are ordinary synchronous
SQLAlchemy code (the ORM Session they receive is the sync one, as in the
seed and in most applications), and the database drivers release the GIL
while they wait. Each lane is a thread with its own claim and work
connections; ``--concurrency N`` runs N lanes. For CPU-bound handlers run
more processes: workers share nothing but the database, so any number of
processes on any number of machines consume one queue with no central node.

Idle lanes wait on one event, set by the PostgreSQL LISTEN thread when a
task is enqueued (NOTIFY is delivered after commit) and by the schedule
routine when it promotes due scheduled tasks, and otherwise by a timeout:
the fallback poll (a lost notification delays a task by seconds, not
forever), or the polling interval on databases without NOTIFY.

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

Settings come from the worker class, the environment, the optional
``queue_configuration`` table and the defaults, in that order
(``catalog.py``), resolved once when the runner is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    OperationalError,
    PendingRollbackError,
    ResourceClosedError,
)
from sqlalchemy.orm import Session

from ..adapters import Adapter, ClaimFilter, adapter_for
from ..catalog import TIME_LIMIT_SECONDS, TableRow
from ..configuration_table import configuration_table_of, read_rows
from ..exceptions import ConfigurationError, WorkerDatabaseError
from ..fanout import FanOut
from ..leases import Claims, Heartbeat, LeasePolicy, new_worker_id
from ..maintenance import Maintenance, RoutineLock, build_routines, routine_lock_for
from ..maintenance.clock import Clock, SystemClock
from ..manager import ConnectionLost, TaskManager, describe_traceback
from ..mixins import channel_of
from ..ranges import LEASE_SECONDS
from ..records import TaskRecord
from ..redaction import describe_error, redact
from ..resolution import Effective, resolve
from ..retry import ExponentialBackoff, RetryPolicy
from ..routing import claim_filter_of
from ..settings import Settings, engine_options, normalize_url
from ..stages.webhook import WebhookStage, webhook_subscribers_of
from ..subscribers import SubscriberMixin
from ..timelimit import TimeLimiter, TimeLimitExceeded
from ..types import dialect_family
from . import providers
from .contract import Worker

logger = logging.getLogger("sqla_queue.worker")

RECONNECT_DELAY_SECONDS = 2.0
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
        fits = int(self.target_seconds / per_task) if per_task > 0 else self.maximum
        grown = self.value * 2 if count >= self.value else self.value
        self.value = max(1, min(self.maximum, grown, fits))


class Runner:
    def __init__(
        self,
        worker: Worker,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
        concurrency: int = 1,
        burst: bool = False,
        batch_size: int | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
    ) -> None:
        type(worker).check_configuration()
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, not {concurrency}")
        self.worker = worker
        self.settings = settings or Settings.from_env()
        self.concurrency = concurrency
        self.burst = burst
        cls = type(worker)
        self.batch_size = 1 if cls.transaction_per_task else (batch_size or worker.batch_size)
        # multi-database tenants: the engine cache, closed in run() (docs/tenants.md)
        worker.open_tenants(self.settings, concurrency)
        model = cls.queue_model()
        self.engine = engine or self._create_engine(url)
        self._check_pool()
        #: the queue_configuration rows (None: no such table, or not read)
        self.configuration_rows = self._read_configuration(model)
        self.effective: Effective = resolve(cls, self.settings, self.configuration_rows)
        effective = self.effective
        # the table's values for what Settings holds, for the code that reads it
        self.settings = dataclasses.replace(
            self.settings,
            max_retry=effective["max_retry"],
            base_interval_retry_minutes=effective["retry_interval_minutes"],
            listen_fallback_seconds=effective["wait_notify_interval"],
            poll_interval_seconds=effective["poll_interval"],
            task_locks=effective["task_locks"],
        )
        self.lease = LeasePolicy(effective["lease_seconds"])
        worker._lease_seconds = self.lease.seconds
        worker._time_limit_seconds = effective["time_limit"]
        table = model.__table__
        providers.check_dialect(dialect_family(self.engine.dialect), self.settings)
        claim_filter = claim_filter_of(cls)
        if effective["item_delay"]:
            claim_filter = dataclasses.replace(
                claim_filter or ClaimFilter(), delay_seconds=effective["item_delay"]
            )
        self.adapter: Adapter = adapter_for(
            self.engine.dialect,
            table,  # type: ignore[arg-type]
            channel_of(model, table),  # type: ignore[arg-type]
            task_locks=providers.task_locks(effective["task_locks"], self.settings),
            claim_filter=claim_filter,
            nsj_locks=self.settings.nsj_locks if cls.nsj_locks is None else cls.nsj_locks,
        )
        self.adapter.prepare_engine(self.engine)
        self.worker_id = new_worker_id()
        self.claims = Claims(self.worker_id)
        subscriber_table = _subscriber_table(cls)
        self.fanout = FanOut(self.adapter, subscriber_table, worker_name=cls.__name__)
        self.stage = _webhook_stage(cls, subscriber_table)
        self.time_limiter = self._time_limiter()
        self.manager = TaskManager(
            self.adapter,
            self._retry_policy(),
            claims=self.claims,
            lease=self.lease,
            fanout=self.fanout,
            stage=self.stage,
            no_retry=cls.no_retry,
            time_limiter=self.time_limiter,
            lease_for=self._lease_for(),
        )
        self.heartbeat = Heartbeat(self.engine, self.adapter, self.claims, self.lease)
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.clock = clock or SystemClock()
        self.maintenance = Maintenance(
            build_routines(
                self.engine,
                self.adapter,
                self.manager,
                effective,
                lease=self.lease,
                wake=self.wake.set,
                clock=self.clock,
                before_delete=cls.purge_before_delete,
            ),
            self.routine_lock(),
            clock=self.clock,
        )
        self._errors: list[BaseException] = []
        self._signals = 0
        self._trimmed = False
        self.listener: Any = None

    def routine_lock(self) -> RoutineLock:
        """The lock the maintenance routines run under: the one place it is
        chosen: the queue server's in client-server mode, else the database's."""
        served = providers.server_routine_lock(self.settings, client_name=self.worker_id)
        if served is not None:
            return served
        return routine_lock_for(self.engine, self.adapter)

    def _read_configuration(self, model: Any) -> dict[str, TableRow] | None:
        """The queue's queue_configuration rows, if the table exists. A
        database that cannot be reached yet is waited for by run(); its
        table is then not read (the worker says so)."""
        table = configuration_table_of(model)
        try:
            with self.engine.connect() as conn:
                return read_rows(conn, table, queue=model.__table__.name)
        except DBAPIError as exc:
            logger.warning(
                "queue_configuration not read (%s): the environment and the defaults apply",
                _describe(exc),
            )
            return None

    def _retry_policy(self) -> RetryPolicy:
        effective = self.effective
        if effective["backoff"] == "linear":
            return self.worker.backoff(self.settings)
        try:
            return ExponentialBackoff(
                max_attempts=effective["max_retry"],
                base_seconds=effective["backoff_base"],
                factor=effective["backoff_factor"],
                jitter_min_seconds=effective["backoff_jitter_min"],
                jitter_max_seconds=effective["backoff_jitter_max"],
            )
        except ConfigurationError as exc:  # the jitter bounds, each valid alone
            low = effective.source("backoff_jitter_min")
            high = effective.source("backoff_jitter_max")
            raise ConfigurationError(f"{exc} (from {low} and {high})") from None

    def _time_limiter(self) -> TimeLimiter | None:
        cls = type(self.worker)
        per_task = cls.overrides("time_limit_for")
        if self.effective["time_limit"] is None and not per_task:
            return None
        worker = self.worker

        def limit_for(task: TaskRecord) -> float | None:
            value = worker.time_limit_for(task)
            if value is None or TIME_LIMIT_SECONDS.contains(value):
                return value
            logger.warning(
                "%s.time_limit_for returned %r: %s; the worker's limit applies",
                cls.__name__,
                value,
                TIME_LIMIT_SECONDS.describe(),
            )
            return worker._time_limit_seconds

        return TimeLimiter(limit_for)

    def _lease_for(self) -> Any:
        cls = type(self.worker)
        if not cls.overrides("lease_seconds_for"):
            return None
        worker, default = self.worker, self.lease.seconds

        def lease_for(task: TaskRecord) -> float:
            value = worker.lease_seconds_for(task)
            if LEASE_SECONDS.contains(value):
                return float(value)
            logger.warning(
                "%s.lease_seconds_for returned %r: %s; the worker's lease applies",
                cls.__name__,
                value,
                LEASE_SECONDS.describe(),
            )
            return default

        return lease_for

    def _connections_needed(self) -> int:
        # two per lane, the heartbeat's, a fresh one to record a batch whose
        # connection died, the routine lock's and one per maintenance routine;
        # the LISTEN connection leaves the pool
        return 2 * self.concurrency + 7

    def _create_engine(self, url: str | URL | None) -> Engine:
        url = url or self.settings.url
        if url is None:
            raise ConfigurationError(
                "no database: pass --url, or set SQLA_QUEUE_URL or the DB_* variables"
            )
        parsed, connect_args = engine_options(normalize_url(url))
        options: dict[str, Any] = {"pool_pre_ping": True, "connect_args": connect_args}
        if (
            parsed.database not in (None, "", ":memory:")
            or dialect_family(parsed.get_backend_name()) != "sqlite"
        ):
            options["pool_size"] = self._connections_needed()
        try:
            return create_engine(parsed, **options)
        except (ArgumentError, ImportError) as exc:  # NoSuchModuleError: an unknown dialect
            from ..settings import driver_error  # only this failure path needs it

            missing = driver_error(parsed, exc)  # a driver not installed: name its extra
            if missing is not None:
                raise missing from None
            raise ConfigurationError(
                f"cannot use the database URL {parsed.render_as_string(hide_password=True)}: "
                f"{redact(str(exc))}"
            ) from None

    def _check_pool(self) -> None:
        """A pool smaller than the lanes need would make them wait for each
        other's connections forever; say so at start."""
        pool = self.engine.pool
        size = getattr(pool, "size", None)
        overflow = getattr(pool, "_max_overflow", None)
        if not callable(size) or overflow is None or overflow < 0:
            return  # not a bounded QueuePool
        allowed = size() + overflow
        needed = self._connections_needed()
        if allowed < needed:
            raise ConfigurationError(
                f"the engine's pool allows {allowed} connections and {self.concurrency} "
                f"lane(s) need {needed}: lower --concurrency or raise pool_size/max_overflow"
            )

    # ----------------------------------------------------------------- run
    def run(self) -> int:
        self._check_table()
        listener = None
        if not self.burst:
            listener = providers.wakeups(
                self.adapter, self.engine, self.settings, client_name=self.worker_id
            )
        if listener is not None:
            listener.start(self.wake)  # a queue server that refuses us stops the worker here
            ready = getattr(listener, "listening", None)
            # the queue server's client connects within start(); LISTEN's thread after it
            if ready is not None and not self.settings.server.enabled:
                ready.wait(LISTEN_READY_TIMEOUT_SECONDS)
        self.listener = listener
        self.heartbeat.start()
        if self.effective["maintenance"]:
            self.maintenance.start()
        restore = self._install_signal_handlers()
        lanes = [
            threading.Thread(target=self._lane, args=(i,), name=f"sqla-queue-lane-{i}")
            for i in range(self.concurrency)
        ]
        logger.info(
            "worker %s (%s): %d lane(s) on %s (%s)%s",
            type(self.worker).__name__,
            self.worker_id,
            self.concurrency,
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
            self.stop()
            self.maintenance.stop()
            if self.time_limiter is not None:
                self.time_limiter.close()
            self.heartbeat.stop()
            if listener is not None:
                listener.stop()
            restore()
            self.worker.close_tenants()  # multi-database: dispose the tenant engines
            if self.stage is not None:
                self.stage.close()
        if self._errors:
            error = self._errors[0]
            if isinstance(error, DBAPIError):
                raise self._database_error(error) from error
            raise error
        logger.info("worker %s stopped", type(self.worker).__name__)
        return 0

    def _database_error(self, error: DBAPIError) -> WorkerDatabaseError:
        where = self.engine.url.render_as_string(hide_password=True)
        return WorkerDatabaseError(f"database error on {where}: {_describe(error)}")

    def _check_table(self) -> None:
        """Refuse to start on a queue table that does not exist, or that
        lacks sqla-queue's lease columns: every claim would fail, and the
        worker would look alive doing nothing."""
        table = self.adapter.table
        while True:
            try:
                with self.engine.connect() as conn:
                    exists = inspect(conn).has_table(table.name, schema=table.schema)
                    missing = self.adapter.missing_columns(conn) if exists else []
                break
            except DBAPIError as exc:
                if self.adapter.is_transient(exc):
                    # SQLite's write lock held past the busy timeout by busy
                    # neighbours: a lane would wait again too, never give up
                    logger.warning("table check: %s; retrying", _describe(exc))
                    continue
                if self.burst or self.adapter.is_permanent(exc) or not _is_disconnect(exc):
                    raise self._database_error(exc) from exc
                logger.warning("cannot reach the database yet (%s); retrying", _describe(exc))
                return
        where = self.engine.url.render_as_string(hide_password=True)
        if not exists:
            raise ConfigurationError(
                f"the queue table {self.adapter.qualified_name} does not exist in "
                f"{where}: create it (Base.metadata.create_all(engine), or a migration) "
                "or check the URL"
            )
        if missing:
            raise ConfigurationError(
                f"the queue table {self.adapter.qualified_name} in {where} lacks "
                f"sqla-queue's column(s) {', '.join(missing)} (a table made by "
                "nsj-queue-lib?): add them as docs/lifecycle.md#leases shows"
            )

    def stop(self) -> None:
        """Finish running tasks, hand back the rest, and return from run()."""
        self.stopping.set()
        self.wake.set()

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
                if self.adapter.is_transient(exc):
                    # a deadlock or a lock timeout: the batch was handed back
                    logger.warning("lane %d: %s; retrying", index, _describe(exc))
                    continue
                if self.burst or self.adapter.is_permanent(exc) or not _is_disconnect(exc):
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
        self.stopping.wait(RECONNECT_DELAY_SECONDS)

    def _lane_loop(self, index: int) -> None:
        limit = BatchLimit(self.batch_size, self.worker.batch_seconds)
        manager = self.manager
        with (
            self.adapter.connect_claim(self.engine) as claim_conn,
            self.engine.connect() as work_conn,
            _invalidated_on_error(claim_conn),
        ):
            if index == 0:
                # as before the routines had threads: at start and after every
                # reconnect, whatever the schedule and the lock say
                self.maintenance.run_now("rescue")
            while not self.stopping.is_set():
                self.wake.clear()
                tasks = manager.claim(claim_conn, limit=limit.value)
                if tasks:
                    result = manager.run_batch(
                        claim_conn, work_conn, tasks, self._handle, self.stopping.is_set
                    )
                    limit.record(result.succeeded + result.failed, result.seconds)
                elif self.burst:
                    # a due scheduled task is ready too: promote it now
                    if self.maintenance.run_now("schedule").counts.get("promoted"):
                        continue
                    return
                else:
                    timeout = self._idle_timeout()
                    if index == 0 and not self._trimmed:
                        self._trimmed = True
                        _return_free_memory()
                    self.wake.wait(timeout)

    def _idle_timeout(self) -> float:
        # the long fallback only while something will wake us: LISTEN, or the
        # queue server, connected; else (none, or lost) poll the database.
        # Due scheduled tasks: the schedule routine promotes them and sets
        # the wake event (and, on PostgreSQL, NOTIFYs the other workers)
        listening = getattr(self.listener, "listening", None)
        if listening is not None and listening.is_set():
            return self.settings.listen_fallback_seconds
        return self.settings.poll_interval_seconds


def _webhook_stage(cls: type[Worker], subscriber_table: Any) -> WebhookStage | None:
    """The webhook delivery of a worker class that hands copies to it."""
    if subscriber_table is None:
        return None
    ids = webhook_subscribers_of(cls)
    if ids is not None and not ids:
        return None
    return WebhookStage(subscriber_table, ids, concurrency=getattr(cls, "webhook_concurrency", 8))


def _subscriber_table(cls: type[Worker]) -> Any:
    """The subscriber table a worker class fans publications out to, if any."""
    model = getattr(cls, "subscriber_model", None)
    if isinstance(model, type) and issubclass(model, SubscriberMixin):
        return getattr(model, "__table__", None)
    return None


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


def _is_disconnect(exc: DBAPIError) -> bool:
    """The connection is gone or was refused: worth reconnecting."""
    return bool(exc.connection_invalidated) or isinstance(exc, (OperationalError, InterfaceError))


def _describe(exc: DBAPIError) -> str:
    """The driver's error on one line, without SQL or parameters."""
    text = redact(str(exc.orig if exc.orig is not None else exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _return_free_memory() -> None:
    """Give the C heap's free pages back to the system, once, when the worker
    first goes idle: start-up (imports, the first connections) leaves a few
    hundred kilobytes that glibc would otherwise keep in an idle worker's RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
