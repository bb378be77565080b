"""``WorkerBase``: subclass it, set ``model``, implement ``execute``.

::

    class Faturar(WorkerBase):
        model = Task
        def execute(self, payload, task, session):
            session.add(Invoice(...))          # commits with the 'sucesso'
            return "faturado"                   # stored in 'mensagem'

Run it with ``sqla-queue worker module:Faturar`` or ``Faturar().run()``.
Both call :meth:`WorkerBase.check_configuration` first, so a mistake in the
class (an attribute of the wrong type, no model) stops the worker at start
with one line naming the class and the attribute.

``async def execute(self, payload, task, session)`` makes an async worker:
its lanes are coroutines on an event loop, and ``session`` is an
``AsyncSession`` on the same transaction (docs/async.md, ``aio.py``).
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import Connection, Engine, Table, event
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from ..client.tenants import TenantEngines, TenantResolver, resolver_from_settings
from ..common.exceptions import ConfigurationError
from ..config.ranges import BASE_INTERVAL_MINUTES, MAX_RETRY, Range
from ..config.settings import Settings
from ..config.sources import check_attributes
from ..enqueue.routing import claim_filter_of
from ..maintenance.periodic import Periodic, check_periodic
from ..policies.limits import check_limits, check_rates
from ..policies.timelimit import Attempt, current_attempt
from ..schema.mixins import QueueMixin
from ..schema.records import TaskRecord
from ..schema.rows import dead_letter_message

logger = logging.getLogger("sqla_queue.worker")

BATCH_SIZE = Range(1, 10_000, integer=True)
#: a batch that takes longer than a day holds its transaction open too long anyway
BATCH_SECONDS = Range(0, 24 * 60 * 60, low_open=True, unit="seconds")
#: the handlers the runner calls: all coroutine functions (an async worker:
#: the base's execute_dead may stay, it awaits nothing) or none
HANDLERS = ("execute", "execute_dead", "dispatch")
#: seconds an async worker's event loop may be held by one step of a
#: coroutine before a warning names the task (a blocking call in a handler)
BLOCKING_WARNING = Range(0.01, 3600, unit="seconds")


class WorkerBase(abc.ABC):
    """A queue's handler. Class attributes tune it; ``None`` means the
    environment's value (``QUEUE_MAX_RETRY``, ``QUEUE_BASE_INTERVAL_RETRY``)."""

    #: the QueueMixin model whose table this worker consumes
    model: ClassVar[type[QueueMixin]]
    #: attempts in all before the dead-letter run (seed: QUEUE_MAX_RETRY)
    max_retry: ClassVar[int | None] = None
    #: minutes; attempt n+1 waits n times this (seed: QUEUE_BASE_INTERVAL_RETRY)
    retry_interval_minutes: ClassVar[float | None] = None
    #: most tasks claimed and committed together; 1 = one task per transaction
    batch_size: ClassVar[int] = 100
    #: batches shrink so that one takes about this long (long tasks go one by one)
    batch_seconds: ClassVar[float] = 0.1
    #: each task in a transaction of its own (no batching): for handlers that
    #: set transaction-scoped state (SET LOCAL, set_config(..., true), the
    #: row-level-security tenant switch) that the next task must not inherit
    transaction_per_task: ClassVar[bool] = False
    #: seconds a claim lasts without a heartbeat (renewed every third of it
    #: while the handler runs); a dead worker's task is rescued after it.
    #: None: SQLA_QUEUE_LEASE_SECONDS, queue_configuration.lease_duration, 30
    lease_seconds: ClassVar[float | None] = None
    # --- retries, limits and maintenance (docs/configuration.md; None: the
    # environment's value, else queue_configuration's, else the default)
    #: "linear" (the seed's) or "exponential" (PEQ's, with jitter)
    backoff_policy: ClassVar[str | None] = None
    backoff_base_seconds: ClassVar[float | None] = None
    backoff_factor: ClassVar[float | None] = None
    backoff_jitter_min_seconds: ClassVar[float | None] = None
    backoff_jitter_max_seconds: ClassVar[float | None] = None
    #: exceptions not worth retrying: a task that raises one goes straight
    #: to its dead-letter run
    no_retry: ClassVar[tuple[type[BaseException], ...]] = ()
    #: milliseconds a finished task's outcome may wait for its commit (the
    #: outcomes of quick tasks share one); None: SQLA_QUEUE_COMMIT_BUDGET_MS,
    #: queue_configuration.commit_budget_ms, 10
    commit_budget_ms: ClassVar[float | None] = None
    #: seconds after which a worker cut off by the network holds nothing
    #: (its sessions end, its routine locks lapse: docs/lifecycle.md); None:
    #: SQLA_QUEUE_DEAD_PEER_SECONDS, queue_configuration.dead_peer_seconds,
    #: twice the lease, at least 10
    dead_peer_seconds: ClassVar[float | None] = None
    #: seconds a handler may run before it is abandoned (timelimit.py)
    time_limit_seconds: ClassVar[float | None] = None
    #: seconds a task waits after its time before it may be claimed
    item_delay_seconds: ClassVar[float | None] = None
    #: minutes a task may stay pendente after its time (0: forever)
    item_ttl_minutes: ClassVar[float | None] = None
    #: False: this worker runs no maintenance routine (others of the queue do)
    maintenance: ClassVar[bool | None] = None
    #: the purge's hook, (conn, table, chain_ids), called in each chunk's
    #: transaction before its DELETE; raising keeps the chunk (an archive)
    purge_before_delete: ClassVar[Callable[[Connection, Table, Sequence[int]], None] | None] = None
    #: the application's periodic tasks (sqla_queue.Periodic): the fleet of
    #: this class enqueues each due occurrence once (docs/periodic.md)
    periodic: ClassVar[Sequence[Periodic]] = ()
    #: fleet-wide concurrency limits, process -> the most of its tasks
    #: running at once across every worker and lane (docs/limits.md)
    concurrency_limits: ClassVar[Mapping[str, int]] = {}
    #: fleet-wide rate limits, process -> tasks per second claimed across
    #: every worker and lane (docs/limits.md)
    rate_limits: ClassVar[Mapping[str, float]] = {}
    #: per-task advisory locks / GET_LOCK, which let the rescue see a killed
    #: worker at once; None: SQLA_QUEUE_TASK_LOCKS (default true). Turn off
    #: behind a transaction-pooling PgBouncer (docs/pgbouncer.md)
    task_locks: ClassVar[bool | None] = None
    #: also take nsj-queue-lib 1.2.2's task lock (pg_try_advisory_lock(id)), so
    #: its workers and these share one queue; None: SQLA_QUEUE_NSJ_LOCKS
    #: (default false). PostgreSQL only (docs/coming-from-nsj-queue-lib.md)
    nsj_locks: ClassVar[bool | None] = None
    # --- routing by process (h14-pubsub): see sqla_queue/enqueue/routing.py
    #: the ``processo`` names this worker claims (a set); None: every task
    processes: ClassVar[frozenset[str] | set[str] | None] = None
    #: multi-database tenants (docs/tenants.md): handlers get a fifth argument,
    #: ``tenant_session``. None: MULTI_DATABASE; True: on, with the resolver the
    #: environment names; False: off whatever the environment says
    multi_database: ClassVar[bool | None] = None
    #: a TenantResolver (UrlTemplateResolver, MappingResolver,
    #: CredentialsApiResolver): turns multi-database on, wins over the environment
    tenant_resolver: ClassVar[TenantResolver | None] = None
    #: the tenant engines while a runner runs this worker (open_tenants)
    _tenant_engines: TenantEngines | None = None
    #: per-key fairness (docs/fairness.md): a column of the model's
    #: ``__queue_fair_by__``; claims take turns by its value (a tenant's
    #: backlog does not starve another tenant's tasks). None: claim order
    fair_by: ClassVar[str | None] = None
    #: with fair_by: at most this many tasks of one key running at once
    #: across the fleet (per tenant, say); None: no limit
    key_concurrency_limit: ClassVar[int | None] = None
    #: with fair_by: at most this many tasks of one key claimed a second
    #: across the fleet (tasks per second, per tenant, say); None: no limit
    key_rate_limit: ClassVar[float | None] = None
    #: async workers: warn, naming the task, when a handler holds the event
    #: loop this long without awaiting (time.sleep, requests, a CPU loop)
    blocking_warning_seconds: ClassVar[float] = 0.5
    #: the effective lease and time limit (use_defaults)
    _lease_seconds: float = 30.0
    _time_limit_seconds: float | None = None

    @abc.abstractmethod
    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str | None:
        """Process one task. ``session`` is on the transaction that records
        the task's ``sucesso``: write through it and both commit together.
        Return a message for ``mensagem`` (or None); raise to fail."""

    def execute_dead(
        self, payload: Any, task: TaskRecord, session: Session, tenant_session: Any = None
    ) -> str | None:
        """Handle a dead-letter run (a task that exhausted its attempts).
        ``tenant_session`` is given in multi-database mode only."""
        message = dead_letter_message(task.live_id)
        # the stored text stays the seed's; the log line is for a person
        logger.warning(
            "task %s exhausted its attempts without success: it needs a person", task.live_id
        )
        return message

    def dispatch(self, task: TaskRecord, session: Session) -> str | None:
        """Route a claimed task to its handler (pub/sub workers extend this).

        In multi-database mode the handler gets a fifth argument, a Session
        on the task's tenant's database, committed when the handler returns:
        before the queue's ``sucesso``, which commits later with its batch
        (docs/tenants.md says what a crash in between does)."""
        handler: Any = self.execute_dead if task.dead else self.execute
        if self._tenant_engines is None:
            return handler(task.payload, task, session)  # type: ignore[no-any-return]
        if type(self).is_async():
            # the runner awaits it: the tenant session lives while it runs
            return self._dispatch_with_tenant(handler, task, session)  # type: ignore[return-value]
        with self.tenant_session(task) as tenant_session:
            return handler(task.payload, task, session, tenant_session)  # type: ignore[no-any-return]

    def use_defaults(self, *, lease_seconds: float, time_limit_seconds: float | None) -> None:
        """The effective lease and time limit (class attribute, environment,
        ``queue_configuration``, default), which :meth:`lease_seconds_for`
        and :meth:`time_limit_for` answer by default; told by ``QueueApp``."""
        self._lease_seconds = lease_seconds
        self._time_limit_seconds = time_limit_seconds

    def lease_seconds_for(self, task: TaskRecord) -> float:
        """The lease of one task, in seconds. Override for per-task leases
        (by process, by payload); the default is the worker's
        (``lease_seconds``, ``SQLA_QUEUE_LEASE_SECONDS``,
        ``queue_configuration.lease_duration``)."""
        return self._lease_seconds

    def time_limit_for(self, task: TaskRecord) -> float | None:
        """The time limit of one task, in seconds (None: none). Override for
        per-task limits; the default is the worker's (``time_limit_seconds``,
        ``SQLA_QUEUE_TIME_LIMIT``, ``queue_configuration.time_limit``)."""
        return self._time_limit_seconds

    @contextlib.contextmanager
    def tenant_session(self, task: TaskRecord) -> Iterator[Session]:
        """A Session on ``task.tenant``'s database for the block: committed
        when the block returns, rolled back when it raises, closed always.
        For dispatch overrides (pub/sub) that call handlers themselves."""
        engines = self._tenant_engines
        if engines is None:
            raise ConfigurationError(
                f"{type(self).__name__} is not in multi-database mode: no tenant session"
            )
        attempt = current_attempt()
        with engines.session(task.tenant) as tenant_session:
            if attempt is not None:
                # under a time limit: the limit cancels its statements too,
                # and no COMMIT of it starts once the limit has passed
                event.listen(tenant_session, "after_begin", _watched_by(attempt))
            yield tenant_session
            # the tenant's work first, the queue's sucesso after
            with attempt.committing() if attempt is not None else contextlib.nullcontext():
                tenant_session.commit()

    async def _dispatch_with_tenant(self, handler: Any, task: TaskRecord, session: Any) -> Any:
        async with self.async_tenant_session(task) as tenant_session:
            result = handler(task.payload, task, session, tenant_session)
            if inspect.isawaitable(result):
                result = await result
            return result

    @contextlib.asynccontextmanager
    async def async_tenant_session(self, task: TaskRecord) -> AsyncIterator[Any]:
        """:meth:`tenant_session` for an async worker: an ``AsyncSession`` on
        ``task.tenant``'s database (its async driver), committed when the
        block returns (before the queue's ``sucesso``), rolled back when it
        raises or is cancelled (a time limit), closed always."""
        engines = self._tenant_engines
        if engines is None:
            raise ConfigurationError(
                f"{type(self).__name__} is not in multi-database mode: no tenant session"
            )
        async with engines.async_session(task.tenant) as tenant_session:
            yield tenant_session
            await tenant_session.commit()

    # ------------------------------------------------------- multi-database
    @classmethod
    def uses_tenants(cls, settings: Settings | None = None) -> bool:
        """Whether handlers get a ``tenant_session``: the class's
        ``tenant_resolver`` or ``multi_database``, else MULTI_DATABASE."""
        if cls.tenant_resolver is not None:
            return True
        if cls.multi_database is not None:
            return bool(cls.multi_database)
        return settings is not None and settings.tenants.multi_database

    def open_tenants(self, settings: Settings, concurrency: int = 1) -> TenantEngines | None:
        """Build the tenant engine cache when multi-database is on (the
        runner calls this at start, and close_tenants() at stop). Refuses a
        handler that cannot take ``tenant_session`` and an incomplete
        environment, with one line; with multi-database off, a handler that
        needs ``tenant_session`` (every task would fail with a TypeError)."""
        cls = type(self)
        self._tenant_engines = None
        if not cls.uses_tenants(settings):
            cls._check_handlers(tenant_session=False)
            return None
        cls._check_handlers(tenant_session=True)
        resolver = cls.tenant_resolver or resolver_from_settings(settings.tenants)
        self._tenant_engines = TenantEngines(
            resolver,
            max_size=settings.tenants.max_engines,
            pool_size=1,
            max_overflow=concurrency,
            asynchronous=cls.is_async(),
        )
        logger.info("%s: multi-database mode, tenants by %r", cls.__name__, resolver)
        return self._tenant_engines

    def close_tenants(self) -> None:
        """Dispose the tenant engines (idempotent)."""
        engines, self._tenant_engines = self._tenant_engines, None
        if engines is not None:
            engines.close()

    async def aclose_tenants(self) -> None:
        """:meth:`close_tenants` for an async worker, on the loop whose
        async engines they are (idempotent)."""
        engines, self._tenant_engines = self._tenant_engines, None
        if engines is not None:
            await engines.aclose()

    @classmethod
    def _check_handlers(cls, *, tenant_session: bool) -> None:
        for handler in ("execute", "execute_dead"):
            cls._require_arguments(handler, "(self, payload, task, session)", tenant_session)

    @classmethod
    def _require_arguments(cls, method: str, signature: str, tenant_session: bool) -> None:
        """Refuse ``method`` unless it can be called with ``signature``'s
        arguments (counted, self included), plus ``tenant_session`` in
        multi-database mode."""
        count = signature.count(",") + 1
        name = f"{cls.__name__}.{method}"
        if tenant_session:
            if not _takes(getattr(cls, method), count + 1):
                full = signature[:-1] + ", tenant_session)"
                raise ConfigurationError(f"{name} must take {full} in multi-database mode")
            return
        if _takes(getattr(cls, method), count):
            return
        if _takes(getattr(cls, method), count + 1):
            raise ConfigurationError(
                f"{name} takes tenant_session, but multi-database mode is off: set "
                "MULTI_DATABASE=true (or the class's multi_database = True or "
                "tenant_resolver), or drop tenant_session"
            )
        raise ConfigurationError(f"{name} must take {signature}")

    @classmethod
    def check_configuration(cls) -> None:
        """Refuse a worker class that cannot run, before it is instantiated:
        one ConfigurationError naming the class and the attribute.

        Checks that ``execute`` is implemented, that none of ``HANDLERS`` is
        a coroutine function (the runner would get a coroutine back, never
        run it, and record the task as done), the tuning attributes' types
        and ranges, and ``model``."""
        name = cls.__name__
        abstract = sorted(getattr(cls, "__abstractmethods__", ()))
        if "execute" in abstract:
            raise ConfigurationError(
                f"{name} is abstract: implement execute(self, payload, task, session)"
            )
        if abstract:
            raise ConfigurationError(f"{name} is abstract: implement {', '.join(abstract)}")
        cls._check_async_handlers()
        # None means "the environment's value", checked when it is read
        if cls.max_retry is not None:
            MAX_RETRY.check(f"{name}.max_retry", cls.max_retry)
        if cls.retry_interval_minutes is not None:
            BASE_INTERVAL_MINUTES.check(
                f"{name}.retry_interval_minutes", cls.retry_interval_minutes
            )
        BATCH_SIZE.check(f"{name}.batch_size", cls.batch_size)
        BATCH_SECONDS.check(f"{name}.batch_seconds", cls.batch_seconds)
        # leases, backoff, time limits, maintenance: the settings catalogue's
        check_attributes(cls)
        _check_no_retry(name, cls.no_retry)
        check_periodic(cls.periodic, name)
        check_limits(cls.concurrency_limits, name)
        check_rates(cls.rate_limits, name)
        if cls.purge_before_delete is not None and not callable(cls.purge_before_delete):
            raise ConfigurationError(
                f"{name}.purge_before_delete must be a function (conn, table, chain_ids), "
                f"not {cls.purge_before_delete!r}"
            )
        for flag, allowed in (
            ("transaction_per_task", (True, False)),
            ("task_locks", (True, False, None)),
            ("nsj_locks", (True, False, None)),
        ):
            value = getattr(cls, flag)
            if not any(value is choice for choice in allowed):
                choices = " or ".join(str(choice) for choice in allowed)
                raise ConfigurationError(f"{name}.{flag} must be {choices}, not {value!r}")
        if not any(cls.multi_database is choice for choice in (True, False, None)):
            raise ConfigurationError(
                f"{name}.multi_database must be True or False or None, not {cls.multi_database!r}"
            )
        if cls.tenant_resolver is not None:
            if not isinstance(cls.tenant_resolver, TenantResolver):
                raise ConfigurationError(
                    f"{name}.tenant_resolver must have a database_url(tenant) method "
                    "(UrlTemplateResolver, MappingResolver, CredentialsApiResolver)"
                )
            if cls.multi_database is False:
                raise ConfigurationError(
                    f"{name} sets tenant_resolver but multi_database = False: drop one"
                )
        if cls.uses_tenants():
            cls._check_handlers(tenant_session=True)
        cls.queue_model()
        # --- routing by process (h14-pubsub)
        from ..enqueue.routing import check_processes

        check_processes(f"{name}.processes", cls.processes)

    @classmethod
    def is_async(cls) -> bool:
        """Whether the handlers are coroutine functions: the worker's lanes
        then run on an event loop (``aio.py``)."""
        return inspect.iscoroutinefunction(getattr(cls, "execute", None))

    @classmethod
    def _handler_methods(cls) -> list[str]:
        """The methods of this class that handle tasks (the base's own
        ``execute_dead`` fits async and sync workers alike)."""
        return [method for method in ("execute", "execute_dead") if cls.overrides(method)]

    @classmethod
    def _check_async_handlers(cls) -> None:
        """All handlers coroutine functions or none, no async generators,
        and no tenant sessions for async handlers."""
        name = cls.__name__
        wanted = cls.is_async()
        for method in (*HANDLERS, *cls._handler_methods()):
            if inspect.isasyncgenfunction(getattr(cls, method, None)):
                raise ConfigurationError(
                    f"{name}.{method} is an async generator; define it with async def "
                    "and return, or with def"
                )
        for method in cls._handler_methods():
            if inspect.iscoroutinefunction(getattr(cls, method, None)) != wanted:
                raise ConfigurationError(
                    f"{name}.{method} is {'not ' if wanted else ''}a coroutine function "
                    f"and other handlers of {name} are{'' if wanted else ' not'}: define "
                    "every handler of a worker with async def, or every one with def"
                )
        if wanted:
            BLOCKING_WARNING.check(f"{name}.blocking_warning_seconds", cls.blocking_warning_seconds)

    @classmethod
    def overrides(cls, method: str) -> bool:
        """Whether this class defines its own ``method`` (``time_limit_for``,
        ``lease_seconds_for``): the runner then asks it for every task."""
        return getattr(cls, method) is not getattr(WorkerBase, method)

    @classmethod
    def unrouted_warning(cls, table_name: str) -> str | None:
        """The start-up warning of a worker class that claims every task of
        its table (``processes`` unset, no subscriptions): any other worker's
        task runs here too. Other such classes on the same table that this
        process has loaded (the same module defines them, say) are named:
        each of them would run the other's tasks. None when the class
        routes its claims."""
        if not _takes_every_task(cls):
            return None
        table = cls.queue_model().__table__
        others = sorted(
            {
                other.__name__
                for other in _concrete_workers(WorkerBase)
                if other is not cls
                and getattr(getattr(other, "model", None), "__table__", None) is table
                and _takes_every_task(other)
            }
        )
        message = f"worker {cls.__name__} takes every process of {table_name} (processes is unset)"
        if others:
            return (
                f"{message}, and so does {', '.join(others)} (loaded in this process): "
                "each runs the others' tasks; set processes on each"
            )
        return (
            f"{message}: a task meant for another worker class runs here; "
            "set processes = {...} to claim only its own"
        )

    @classmethod
    def queue_model(cls) -> type[QueueMixin]:
        model = getattr(cls, "model", None)
        if not (
            isinstance(model, type)
            and issubclass(model, QueueMixin)
            and hasattr(model, "__table__")
        ):
            raise ConfigurationError(
                f"{cls.__name__}.model must be a mapped QueueMixin model, not {model!r}"
            )
        return model

    def run(
        self,
        url: str | URL | None = None,
        *,
        engine: Engine | None = None,
        concurrency: int = 1,
        burst: bool = False,
        batch_size: int | None = None,
        settings: Settings | None = None,
        commit_budget_ms: float | None = None,
    ) -> int:
        """Process tasks until stopped (or, with ``burst``, until none is
        ready). Returns the process exit status (0). ``commit_budget_ms``:
        over ``commit_budget_ms``'s other sources (docs/lifecycle.md)."""
        from .runner import Runner

        if type(self).is_async():
            from .aio import AsyncRunner as Runner  # type: ignore[assignment]

        return Runner.for_worker(
            self,
            url=url,
            engine=engine,
            concurrency=concurrency,
            burst=burst,
            batch_size=batch_size,
            commit_budget_ms=commit_budget_ms,
            settings=settings,
        ).run()


def _check_no_retry(name: str, value: object) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(item, type) and issubclass(item, BaseException) for item in value
    ):
        raise ConfigurationError(
            f"{name}.no_retry must be a tuple of exception classes, not {value!r}"
        )


def _watched_by(attempt: Attempt) -> Callable[..., None]:
    def after_begin(session: Session, transaction: Any, connection: Connection) -> None:
        attempt.watch(connection)

    return after_begin


def _takes(method: Any, count: int) -> bool:
    """Whether ``method`` can be called with ``count`` positional arguments
    (self included); True when it has no signature to read (a builtin: it
    fails at run time)."""
    try:
        inspect.signature(method).bind(*(None,) * count)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def _takes_every_task(cls: type[WorkerBase]) -> bool:
    try:
        return claim_filter_of(cls) is None
    except ConfigurationError:  # another class, refused when it runs
        return False


def _concrete_workers(base: type) -> Iterator[type[WorkerBase]]:
    cls: type[WorkerBase]
    for cls in base.__subclasses__():
        if not getattr(cls, "__abstractmethods__", None):
            yield cls
        yield from _concrete_workers(cls)
