"""The composition root: a worker's parts, built once, in one place.

:class:`QueueApp` takes a worker (a ``WorkerBase`` instance) and a URL or an
engine, and builds everything the worker's queue needs: the engine (one
factory, sized for the lanes), the effective configuration (class attribute,
environment, ``queue_configuration`` table, default), the adapter, the
leases and claims, the limits and fairness, the retry policy, the
middleware (the time limit, sync or async, and the registered ones), the
batch stages (pub/sub fan-out, webhook delivery), the manager, the heartbeat,
the wake-ups, the maintenance routines and their lock provider, for a sync
and an async worker alike. The :class:`~sqla_queue.worker.runner.Runner`
takes it built and only runs lanes, the heartbeat, the wake-ups and the
signals on these parts; ``maintenance run`` uses the root alone and starts
nothing. An operator's command (cancel, retry-now, pause, requeue) needs
less: :class:`~sqla_queue.worker.operator.OperatorContext`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from ..adapters import Adapter, ClaimFilter, ErrorKind, Listener, adapter_for
from ..adapters.configuration import read_rows
from ..adapters.limits import RateBuckets
from ..adapters.liveness import default_bound
from ..adapters.sqla_private import pool_max_overflow
from ..batch.manager import ClaimSource, PlainClaims, TaskManager, task_label
from ..common.exceptions import ConfigurationError, WorkerDatabaseError
from ..config.ranges import COMMIT_BUDGET_MS, LEASE_SECONDS, TIME_LIMIT_SECONDS
from ..config.resolution import Effective, resolve
from ..config.settings import Settings, make_async_engine, make_engine
from ..enqueue.routing import claim_filter_of
from ..maintenance import Maintenance, RoutineLock, SlotRun, build_routines, routine_lock_for
from ..maintenance.clock import Clock, SystemClock
from ..policies.fairness import FairClaims, check_fair_by, check_key_limit, check_key_rate
from ..policies.hooks import ROUTINE_RAN, Hooks, RoutineEvent, registry
from ..policies.leases import Claims, Heartbeat, LeasePolicy, new_worker_id
from ..policies.limits import LimitedClaims, check_limits, check_rates
from ..policies.pipeline import registered_middleware
from ..policies.retry import ExponentialBackoff, LinearBackoff, RetryPolicy
from ..policies.timelimit import TimeLimiter
from ..schema.configuration_table import configuration_table_of, ensure_table, has_queue_name
from ..schema.mixins import channel_of
from ..schema.records import TaskRecord
from ..schema.subscribers import SubscriberMixin
from ..stages.fanout import FanOut
from ..stages.webhook import WebhookStage, webhook_subscribers_of
from . import providers
from .contract import Worker
from .operator import check_table, database_error, describe, read_configuration
from .wakeup import AsyncLaneWakeup, LaneWakeup

__all__ = ["QueueApp"]

logger = logging.getLogger("sqla_queue.worker")


class QueueApp:
    """A worker's parts (see the module). ``concurrency``: the lanes the
    engine's pool must serve; ``batch_size``: the most tasks a claim takes
    (default: the worker's; 1 for ``transaction_per_task``);
    ``commit_budget_ms``: the commit budget (docs/lifecycle.md), over the
    worker's, the environment's and the configuration table's."""

    def __init__(
        self,
        worker: Worker,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
        concurrency: int = 1,
        batch_size: int | None = None,
        commit_budget_ms: float | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
        hooks: Hooks | None = None,
        connection: Connection | None = None,
    ) -> None:
        type(worker).check_configuration()
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, not {concurrency}")
        self.worker = worker
        self.settings = settings or Settings.from_env()
        self.concurrency = concurrency
        cls = type(worker)
        #: the handlers are coroutines: the lanes run on an event loop, on
        #: connections of an async engine of their own (worker/aio.py)
        self.is_async = cls.is_async()
        self.batch_size = 1 if cls.transaction_per_task else (batch_size or worker.batch_size)
        # multi-database tenants: the engine cache, closed by close() (docs/tenants.md)
        worker.open_tenants(self.settings, concurrency)
        model = cls.queue_model()
        #: the caller's connection, in its own transaction (sqla_queue.testing):
        #: the parts run there; the engine is neither sized nor set up
        self.connection = connection
        if connection is not None:
            self.engine = connection.engine
            self.configuration_rows = read_rows(
                connection, configuration_table_of(model), queue=model.__table__.name
            )
            self.configuration_unread = False
        else:
            self.engine = engine or self._create_engine(url)
            self._check_pool()
            #: the queue_configuration rows (None: no such table, or not
            #: read), and whether the database could not be reached to read them
            self.configuration_rows, self.configuration_unread = read_configuration(
                self.engine, model
            )
        #: the engine whose connections the lanes claim and work on: the
        #: worker's, or for async handlers the sync face of an async engine
        #: (its statements run only inside the lanes' greenlets)
        self.async_engine: Any = None
        self.lane_engine: Engine = self.engine
        if self.is_async and connection is None:
            # from the URL as given (its options, prepare_threshold among
            # them, become connect arguments), else from the engine's
            self.async_engine = make_async_engine(
                url or self.settings.url or self.engine.url if engine is None else engine.url,
                pool_size=self._lane_connections(),
                max_overflow=0,
            )
            self.lane_engine = self.async_engine.sync_engine
        self.effective: Effective = resolve(cls, self.settings, self.configuration_rows)
        effective = self.effective
        # from here on, every resolved value is read from effective: settings
        # carries what the catalogue does not resolve (URL, tenants, server)
        self.lease = LeasePolicy(effective["lease_seconds"])
        worker.use_defaults(
            lease_seconds=self.lease.seconds, time_limit_seconds=effective["time_limit"]
        )
        claim_filter = claim_filter_of(cls)
        if effective["item_delay"]:
            claim_filter = dataclasses.replace(
                claim_filter or ClaimFilter(), delay_seconds=effective["item_delay"]
            )
        in_transaction = connection is not None  # one connection: no lock to outlive it
        #: seconds after which this worker, cut off by the network, holds
        #: nothing (adapters/liveness.py)
        self.dead_peer_seconds: float | None = None
        if not in_transaction:
            bound = effective["dead_peer"]
            self.dead_peer_seconds = (
                default_bound(self.lease.seconds) if bound is None else float(bound)
            )
        self._claim_filter = claim_filter
        self._adapter_options: dict[str, Any] = {
            "dead_peer_seconds": self.dead_peer_seconds,
            "task_locks": not in_transaction
            and providers.task_locks(effective["task_locks"], self.settings),
            "nsj_locks": not in_transaction
            and (self.settings.nsj_locks if cls.nsj_locks is None else cls.nsj_locks),
            "in_caller_transaction": in_transaction,
        }
        #: processes with a fleet-wide concurrency limit (limits.py): claimed
        #: apart, under a lock, and left out of the main claim
        self._limits, self._rates = self._limits_of(cls, claim_filter)
        self._limited = frozenset(self._limits) | frozenset(self._rates)
        if self._limited:
            claim_filter = dataclasses.replace(claim_filter or ClaimFilter(), paused=self._limited)
            self._claim_filter = claim_filter
        self.adapter: Adapter = self._adapter_for(claim_filter)
        #: per-key fairness (fairness.py): the column the claims take turns
        #: by, and the most running tasks of one of its keys
        self._fair_by = check_fair_by(cls.fair_by, cls.__name__, model, model.__table__)
        self._key_limit = check_key_limit(cls.key_concurrency_limit, cls.__name__, self._fair_by)
        self._key_rate = check_key_rate(cls.key_rate_limit, cls.__name__, self._fair_by)
        self._buckets: RateBuckets | None = None
        #: the adapter whose claims skip each set of paused processes (pause.py)
        self._paused_adapters: dict[frozenset[str], ClaimSource] = {}
        providers.check_adapter(self.adapter, self.settings)
        if not in_transaction:
            for prepared in {self.engine, self.lane_engine}:
                self.adapter.prepare_engine(prepared)
                # the task locks asked for (client-server mode turns them
                # off on direct connections too): off, the sign of a
                # transaction-pooling PgBouncer (docs/pgbouncer.md)
                self.adapter.guard_dead_peers(prepared, server_side=bool(effective["task_locks"]))
        self.worker_id = new_worker_id()
        #: the observers of outcomes (hooks.py): the process's registry by default
        self.hooks = registry if hooks is None else hooks
        self.claims = Claims(self.worker_id)
        subscriber_table = _subscriber_table(cls)
        self.fanout = FanOut(self.adapter, subscriber_table, worker_name=cls.__name__)
        self.stage = _webhook_stage(cls, subscriber_table, self.adapter)
        self.time_limiter = self._time_limiter(in_transaction)
        if commit_budget_ms is not None:
            COMMIT_BUDGET_MS.check("commit_budget_ms", commit_budget_ms)
        else:
            commit_budget_ms = effective["commit_budget"]
        #: what the manager claims through: the main source, or while
        #: processes are paused, a source that skips them (pause_claims)
        self._main_source = self._claim_source(claim_filter, self.adapter)
        self._claim_through = _Switchable(self._main_source)
        self.manager = TaskManager(
            self.adapter,
            self._retry_policy(),
            claims=self.claims,
            lease=self.lease,
            # the webhook delivery innermost, as a copy it answers for is
            # never a publication; the time limit around everything
            stages=[stage for stage in (self.stage, self.fanout) if stage is not None],
            middleware=[
                *([] if self.time_limiter is None else [self.time_limiter]),
                *registered_middleware(model.__table__.name),
            ],
            no_retry=cls.no_retry,
            lease_for=self._lease_for(),
            hooks=self.hooks,
            claim_source=self._claim_through,
            limited=self._limited_claims(),
            commit_budget=float(commit_budget_ms) / 1000,
        )
        #: renews the leases of the tasks the lanes hold (a thread: leases.py)
        self.heartbeat = Heartbeat(self.engine, self.adapter, self.claims, self.lease)
        #: wakes idle lanes, one a call (the schedule routine calls it too);
        #: coroutine lanes wait on the event loop, woken from any thread
        self.wake = (AsyncLaneWakeup if self.is_async else LaneWakeup)(self.concurrency)
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
                periodic=cls.periodic,
                markers=configuration_table_of(model) if cls.periodic else None,
                buckets=self._buckets,
            ),
            self.routine_lock(),
            clock=self.clock,
            on_result=self._routine_ran,
        )

    def routine_lock(self) -> RoutineLock:
        """The lock the maintenance routines run under: the one place it is
        chosen: the queue server's in client-server mode, else the database's."""
        served = providers.server_routine_lock(self.settings, client_name=self.worker_id)
        if served is not None:
            return served
        lock = routine_lock_for(self.engine, self.adapter)
        if hasattr(lock, "owner"):  # the database's: its session shows the worker
            lock.owner = self.worker_id
        return lock

    def wakeups(self) -> Listener | None:
        """The wake-up provider (not started): the queue server's in
        client-server mode, LISTEN on PostgreSQL, else None (polling)."""
        return providers.wakeups(
            self.adapter, self.engine, self.settings, client_name=self.worker_id
        )

    def _retry_policy(self) -> RetryPolicy:
        effective = self.effective
        if effective["backoff"] == "linear":
            return LinearBackoff(
                max_attempts=int(effective["max_retry"]),
                base_interval_minutes=effective["retry_interval_minutes"],
            )
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

    def _time_limiter(self, in_transaction: bool) -> TimeLimiter | None:
        """The time limit, innermost of the middleware: a sync handler runs
        on a helper thread, abandoned past it; an async handler's coroutine
        is awaited here, cancelled past it (timelimit.py)."""
        cls = type(self.worker)
        per_task = cls.overrides("time_limit_for")
        if self.effective["time_limit"] is None and not per_task and not self.is_async:
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
            return self.effective["time_limit"]  # type: ignore[no-any-return]

        return TimeLimiter(
            limit_for,
            coroutines=self.is_async,
            give_up_connection=not in_transaction,
            describe=task_label,
        )

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
        # the LISTEN connection leaves the pool. An async worker's lanes take
        # theirs from the async engine (_lane_connections)
        lanes = 0 if self.is_async else self._lane_connections() - 1
        return lanes + 7

    def _lane_connections(self) -> int:
        # two per lane, and a fresh one to record a batch whose connection died
        return 2 * self.concurrency + 1

    def _create_engine(self, url: str | URL | None) -> Engine:
        url = url or self.settings.url
        if url is None:
            raise ConfigurationError(
                "no database: pass --url, or set SQLA_QUEUE_URL or the DB_* variables"
            )
        return make_engine(url, pool_size=self._connections_needed())

    def _check_pool(self) -> None:
        """A pool smaller than the lanes need would make them wait for each
        other's connections forever; say so at start."""
        pool = self.engine.pool
        size = getattr(pool, "size", None)
        overflow = pool_max_overflow(pool)
        if not callable(size) or overflow is None or overflow < 0:
            return  # not a bounded QueuePool
        allowed = size() + overflow
        needed = self._connections_needed()
        if allowed < needed:
            raise ConfigurationError(
                f"the engine's pool allows {allowed} connections and {self.concurrency} "
                f"lane(s) need {needed}: lower --concurrency or raise pool_size/max_overflow"
            )

    def database_error(self, error: DBAPIError) -> WorkerDatabaseError:
        """``error`` as one line naming the database (without its password)."""
        return database_error(self.engine, error)

    def _adapter_for(self, claim_filter: ClaimFilter | None) -> Adapter:
        model = type(self.worker).queue_model()
        table = model.__table__
        return adapter_for(
            self.engine.dialect,
            table,  # type: ignore[arg-type]
            channel_of(model, table),  # type: ignore[arg-type]
            claim_filter=claim_filter,
            **self._adapter_options,
        )

    def _limits_of(
        self, cls: type, claim_filter: ClaimFilter | None
    ) -> tuple[dict[str, int], dict[str, float]]:
        """The worker's concurrency and rate limits on the processes it claims."""
        limits = check_limits(getattr(cls, "concurrency_limits", {}), cls.__name__)
        rates = check_rates(getattr(cls, "rate_limits", {}), cls.__name__)
        if (limits or rates) and claim_filter is not None:
            if claim_filter.subscriber_ids is not None or claim_filter.all_subscribers:
                raise ConfigurationError(
                    f"{cls.__name__}: a pub/sub or webhook worker cannot limit processes "
                    "(concurrency_limits, rate_limits: its claims route copies by subscriber)"
                )
            if claim_filter.processes is not None:
                limits = {p: n for p, n in limits.items() if p in claim_filter.processes}
                rates = {p: n for p, n in rates.items() if p in claim_filter.processes}
        return limits, rates

    def _limited_claims(self) -> LimitedClaims | None:
        if not self._limited:
            return None
        base = dataclasses.replace(self._claim_filter or ClaimFilter(), paused=frozenset())
        table = self.adapter.table
        return LimitedClaims(
            self._limits,
            lambda process: self._adapter_for(
                dataclasses.replace(base, processes=frozenset({process}))
            ),
            self.adapter.limits,
            namespace=f"limits:{table.schema}.{table.name}",
            rates=self._rates,
            buckets=self._rate_buckets() if self._rates else None,
        )

    def _rate_buckets(self) -> RateBuckets:
        """The rate limits' token buckets, in the queue's configuration
        table (made here if missing: DDL before any claim); made once. A
        database that cannot be reached yet (the lanes wait for it) gets
        the table at the first claim instead."""
        if self._buckets is None:
            model = type(self.worker).queue_model()
            settings = configuration_table_of(model)

            def prepare() -> bool:
                ensure_table(self.engine, settings)
                with self.engine.connect() as conn:
                    return has_queue_name(conn, settings)

            buckets = RateBuckets(settings, self.adapter.table.name, prepare=prepare)
            try:
                buckets.ready()
            except DBAPIError as exc:
                if self.adapter.classify(exc) is not ErrorKind.DISCONNECT:
                    raise self.database_error(exc) from exc
                logger.warning(
                    "rate limit buckets not ready (%s): made at the first claim", describe(exc)
                )
            self._buckets = buckets
        return self._buckets

    def pause_claims(self, paused: frozenset[str]) -> None:
        """Make the manager's claims skip ``paused`` processes (none: claim
        as the worker class says). An adapter per set, made once: its claim
        statements are compiled with the set in them; its locks are the
        queue's, as the main adapter's. Processes with a concurrency limit
        stay out of the main claim either way (limits.py)."""
        if self.manager.limited is not None:
            self.manager.limited.paused = paused
        paused = paused | self._limited
        if paused == self._limited:
            self._claim_through.current = self._main_source
            return
        source = self._paused_adapters.get(paused)
        if source is None:
            claim_filter = dataclasses.replace(self._claim_filter or ClaimFilter(), paused=paused)
            source = self._claim_source(claim_filter, self._adapter_for(claim_filter))
            self._paused_adapters[paused] = source
        self._claim_through.current = source

    def _claim_source(self, claim_filter: ClaimFilter | None, plain: Adapter) -> ClaimSource:
        """How the manager claims through ``plain``: its claim, or for a
        worker with ``fair_by`` the fair claim over it (fairness.py)."""
        if self._fair_by is None:
            return PlainClaims(plain)
        base = claim_filter or ClaimFilter()
        table = plain.table
        return FairClaims(
            plain,
            lambda null: self._adapter_for(
                dataclasses.replace(base, fair_column=self._fair_by, fair_null=null)
            ),
            plain.fairness(self._fair_by),
            key_limit=self._key_limit,
            key_rate=self._key_rate,
            buckets=self._rate_buckets() if self._key_rate is not None else None,
            namespace=f"keys:{table.schema}.{table.name}.{self._fair_by}",
        )

    def check_table(self, *, wait_for_database: bool = False) -> None:
        """Refuse to start on a missing or foreign queue table (operator.check_table)."""
        check_table(
            self.engine,
            self.adapter,
            wait_for_database=wait_for_database,
            configuration_unread=self.configuration_unread,
        )

    def _routine_ran(self, run: SlotRun) -> None:
        if self.hooks.wanted(ROUTINE_RAN):
            result = run.result
            event = RoutineEvent(
                ROUTINE_RAN, result.routine, dict(result.counts), result.error, result.seconds
            )
            self.hooks.emit([event])

    def close(self) -> None:
        """Release what the parts hold (time-limit threads, tenant engines,
        HTTP pools); the engine stays open for its owner."""
        self.maintenance.stop()
        if self.time_limiter is not None:
            self.time_limiter.close()
        self.worker.close_tenants()  # multi-database: dispose the tenant engines
        if self.stage is not None:
            self.stage.close()


def _webhook_stage(
    cls: type[Worker], subscriber_table: Any, adapter: Adapter
) -> WebhookStage | None:
    """The webhook delivery of a worker class that hands copies to it."""
    if subscriber_table is None:
        return None
    ids = webhook_subscribers_of(cls)
    if ids is not None and not ids:
        return None
    concurrency = getattr(cls, "webhook_concurrency", 8)
    return WebhookStage(subscriber_table, ids, adapter=adapter, concurrency=concurrency)


def _subscriber_table(cls: type[Worker]) -> Any:
    """The subscriber table a worker class fans publications out to, if any."""
    model = getattr(cls, "subscriber_model", None)
    if isinstance(model, type) and issubclass(model, SubscriberMixin):
        return getattr(model, "__table__", None)
    return None


class _Switchable:
    """The manager's claim source, switched by :meth:`QueueApp.pause_claims`
    to one that skips the paused processes (each compiled once)."""

    def __init__(self, current: ClaimSource) -> None:
        self.current = current

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        return self.current.claim(conn, limit=limit, owner=owner, lease_seconds=lease_seconds)

    @property
    def capped(self) -> bool:
        return self.current.capped

    @property
    def retry_in(self) -> float | None:
        return self.current.retry_in
