"""What a queue is doing, counted in tasks, not attempts.

One row of a queue table is one attempt. A **chain** is a task's attempts:
the rows that share ``COALESCE(id_inicial, id)`` and are not dead-letter
runs (``dead`` false). Its state is that of its newest attempt (the one not
``reenfileirado``):

============  ===========================================================
state         newest attempt
============  ===========================================================
ready         ``pendente``, attempt 1
scheduled     ``agendada``, attempt 1
retrying      ``pendente`` or ``agendada``, attempt > 1
running       ``processando``
succeeded     ``sucesso``
failed        ``falha`` or ``falha_processando``: its retries are spent
cancelled     ``falha`` with ``mensagem`` "Tarefa cancelada pelo operador."
              (``sqla-queue cancel``: it waited, and will not run)
============  ===========================================================

``dead_letter`` counts the dead-letter runs (rows with ``dead`` true and no
``id_inicial``, whatever became of them). A timeline's ``state`` is that of
the chain the id asked for belongs to (a requeued chain's own, a dead-letter
run's ``dead_letter``), and each of its rows says what became of that one
attempt, in English (:data:`ATTEMPT_STATES`, :func:`attempt_state`), beside
the stored ``status``:

============  ===========================================================
attempt       stored values
============  ===========================================================
ready         ``pendente``
scheduled     ``agendada``
running       ``processando``
succeeded     ``sucesso``
retried       ``falha`` and ``reenfileirado``: a retry followed it
failed        ``falha``, no retry after it
cancelled     ``falha`` with the cancellation's ``mensagem``
rescued       ``falha_processando``: its worker died (the rescue failed it)
============  ===========================================================

A dead-letter run's attempt is shown as "dead-letter run succeeded" (and
so on), never as a bare success (:attr:`Attempt.label`). The oldest ready
task leaves out the tasks of paused processes (``client/pause.py``): they
wait on purpose. The same definitions serve
``sqla-queue status``, the metrics and the dashboard (docs/operations.md).
Every chain is in exactly one state, so a process's states add up to its
tasks. The throughput counts attempts, not tasks: the attempts that
finished in a window, as succeeded, failed or cancelled (which add up to
the finished ones, dead-letter runs' attempts among them).

    from sqla_queue.ops.status import queue_status, task_timeline

    status = queue_status(engine, Task)          # or a Session, a Connection
    status.totals.ready, status.processes["faturar"].failed
    status.as_json()                             # what `status --json` prints
    task_timeline(session, Task, 41).rows        # one chain, every attempt

Everything here reads; nothing writes or locks. The texts are the stored
ones, as they are: a presentation escapes what a terminal would act on
(``sqla-queue status``: sqla_queue.common.redaction.escape_controls; ``as_json``
is for json.dumps). Each call reads in its own
statements: on a busy queue a task that moves between two of them can be
counted in neither or in both states for that one call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.orm import Session

from ..adapters import Adapter, adapter_of
from ..adapters.base import LockHolder, TableHealth
from ..adapters.inspection import TASK_STATES, InspectionQueries, task_state
from ..adapters.locks import routine_key
from ..client.pause import paused_processes
from ..client.queue import resolve_table
from ..common.exceptions import ConfigurationError, TaskNotFoundError
from ..common.types import utcnow
from ..maintenance import ROUTINES
from ..maintenance.periodic import Periodic, last_runs, next_runs
from ..maintenance.ttl import expiry_gloss
from ..schema.configuration_table import configuration_table_of
from ..schema.mixins import QueueMixin, Status
from ..schema.rows import CANCELLED_MESSAGES, MESSAGE_GLOSSES, SUFFIX_GLOSSES
from . import status_counts as status_summary

__all__ = [
    "ATTEMPT_STATES",
    "HORIZON_WARN_SECONDS",
    "STATES",
    "Attempt",
    "Counts",
    "DeadTask",
    "Failure",
    "Health",
    "QueueStatus",
    "RunningTask",
    "Throughput",
    "Timeline",
    "attempt_state",
    "dead_letter",
    "describe_age",
    "message_gloss",
    "queue_status",
    "recent_copies",
    "task_timeline",
]

#: the chain states and the dead letter, in the order they are shown
STATES = TASK_STATES
#: what became of one attempt (a timeline's row: :func:`attempt_state`)
ATTEMPT_STATES = (
    "ready",
    "scheduled",
    "running",
    "succeeded",
    "retried",
    "failed",
    "cancelled",
    "rescued",
)
#: a snapshot held this long is reported as holding back the vacuum
HORIZON_WARN_SECONDS = 60.0

_PENDING = Status.PENDING.value
_SCHEDULED = Status.SCHEDULED.value
_PROCESSING = Status.PROCESSING.value
_SUCCEEDED = Status.SUCCEEDED.value
_FAILED = (Status.FAILED.value, Status.FAILED_PROCESSING.value)

Bind = Session | Connection | Engine
Queue = str | type[QueueMixin] | Table


@dataclass
class Counts:
    """Chains by state, and dead-letter runs (see the module)."""

    ready: int = 0
    scheduled: int = 0
    running: int = 0
    retrying: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    dead_letter: int = 0

    def as_dict(self) -> dict[str, int]:
        return {state: getattr(self, state) for state in STATES}

    def add(self, state: str, n: int) -> None:
        setattr(self, state, getattr(self, state) + n)

    @classmethod
    def sum(cls, many: Iterable[Counts]) -> Counts:
        total = cls()
        for counts in many:
            for state in STATES:
                total.add(state, getattr(counts, state))
        return total

    @property
    def open(self) -> int:
        """Chains not yet finished: ready, scheduled, retrying, running."""
        return self.ready + self.scheduled + self.retrying + self.running


@dataclass(frozen=True)
class Throughput:
    """Attempts (not tasks) that finished in the last ``window_seconds``:
    ``finished`` is ``succeeded + failed + cancelled``, dead-letter runs'
    attempts among them."""

    window_seconds: float
    finished: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def per_minute(self) -> float:
        return self.finished * 60.0 / self.window_seconds

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts over finished ones, cancellations left out of
        both (None: nothing finished but cancellations)."""
        ran = self.finished - self.cancelled
        return None if not ran else self.failed / ran

    def as_json(self) -> dict[str, Any]:
        return {
            "window_seconds": self.window_seconds,
            "finished": self.finished,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "per_minute": round(self.per_minute, 3),
            "failure_rate": self.failure_rate,
        }


@dataclass(frozen=True)
class RunningTask:
    id: int
    chain_id: int
    process: str | None
    tenant: int | None
    attempt: int
    dead: bool
    worker_id: str | None
    started_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    #: how long it has run (None: no start time, a row claimed before leases)
    running_seconds: float | None


@dataclass(frozen=True)
class Failure:
    id: int
    chain_id: int
    process: str | None
    tenant: int | None
    attempt: int
    dead: bool
    status: str
    message: str | None
    finished_at: dt.datetime | None
    worker_id: str | None


@dataclass(frozen=True)
class Health:
    """The table's storage (PostgreSQL), and a warning when a transaction
    holds the vacuum horizon long enough to hurt the claims."""

    table: TableHealth
    warning: str | None


@dataclass(frozen=True)
class QueueStatus:
    queue: str
    processes: dict[str, Counts]
    totals: Counts
    #: per tenant (empty when no task has a tenant): its totals, and per process
    tenants: dict[str, Counts]
    tenant_processes: dict[str, dict[str, Counts]]
    #: age of the oldest ready task, paused processes' left out (None:
    #: nothing is ready)
    oldest_ready_seconds: float | None
    throughput: Throughput
    throughput_by_process: dict[str, Throughput]
    running: list[RunningTask]
    failures: list[Failure]
    health: Health | None
    taken_at: dt.datetime
    #: processes paused across the fleet (their ready tasks wait: pause.py)
    paused: frozenset[str] = frozenset()
    #: the worker class's periodic tasks: name, schedule, process,
    #: last_enqueued, next_run (maintenance/periodic.py)
    periodic: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the routine locks held now, by whom (where the database can say:
    #: PostgreSQL, MariaDB/MySQL; docs/lifecycle.md#network-partitions)
    routine_locks: list[LockHolder] = dataclasses.field(default_factory=list)
    #: the paused processes with ready tasks: left out of oldest_ready_seconds
    oldest_ready_paused_left_out: int = 0

    def as_json(self) -> dict[str, Any]:
        """What ``sqla-queue status --json`` and ``GET /api/status`` give."""
        data: dict[str, Any] = {
            "queue": self.queue,
            "processes": {name: counts.as_dict() for name, counts in self.processes.items()},
            "totals": self.totals.as_dict(),
            "oldest_ready_seconds": self.oldest_ready_seconds,
            "oldest_ready_paused_left_out": self.oldest_ready_paused_left_out,
            "tenants": {
                tenant: {
                    "totals": counts.as_dict(),
                    "processes": {
                        name: by.as_dict()
                        for name, by in self.tenant_processes.get(tenant, {}).items()
                    },
                }
                for tenant, counts in self.tenants.items()
            },
            "throughput": self.throughput.as_json(),
            "throughput_by_process": {
                name: item.as_json() for name, item in self.throughput_by_process.items()
            },
            "running": [_jsonable(dataclasses.asdict(item)) for item in self.running],
            "failures": [_jsonable(dataclasses.asdict(item)) for item in self.failures],
            "table": None,
            "paused": sorted(self.paused),
            "periodic": self.periodic,
            "routine_locks": [_jsonable(dataclasses.asdict(h)) for h in self.routine_locks],
            "taken_at": self.taken_at.isoformat(),
        }
        if self.health is not None:
            data["table"] = {
                **dataclasses.asdict(self.health.table),
                "warning": self.health.warning,
            }
        return data


@dataclass(frozen=True)
class Attempt:
    """One row of a chain's timeline. ``kind``: ``attempt`` (the task's
    own), ``dead_letter`` (a dead-letter run's), ``requeued`` (a chain
    requeued from the dead letter), ``copy`` (a pub/sub copy or webhook
    delivery it made)."""

    kind: str
    id: int
    chain_id: int
    attempt: int
    status: str | None
    dead: bool
    process: str | None
    subscriber_id: str | None
    run_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    worker_id: str | None
    message: str | None
    #: a failed attempt's traceback (error_traceback), else None
    traceback: str | None = None
    #: what became of this attempt, in English (:data:`ATTEMPT_STATES`;
    #: None: a status sqla-queue does not write)
    state: str | None = None

    @property
    def label(self) -> str:
        """The attempt's state for a person: "dead-letter run succeeded"
        for a dead-letter run's (never a bare success), the stored status
        when there is no English word for it."""
        word = self.state or self.status or "-"
        return f"dead-letter run {word}" if self.dead else word


@dataclass(frozen=True)
class Timeline:
    """A task's chain, its dead-letter runs, the chains requeued from them,
    and the copies it published, each oldest first. ``chain_id``: the
    task's first attempt, whichever of the family's ids was asked for;
    ``state``: the state (:data:`STATES`) of the chain the asked id belongs
    to, ``own_chain_id`` (a requeued chain's own, ``dead_letter`` for a
    dead-letter run's)."""

    task_id: int
    chain_id: int
    state: str
    process: str | None
    rows: list[Attempt] = field(default_factory=list)
    #: the task's chave_externa (of the row whose id was asked for)
    external_key: str | None = None
    #: the first id of the chain whose state ``state`` is (None: chain_id)
    own_chain_id: int | None = None
    #: the chains requeued from its dead-letter runs: first id, state
    requeued: dict[int, str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Attempt]:
        return [row for row in self.rows if row.kind == kind]

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "chain_id": self.chain_id,
            "state": self.state,
            "process": self.process,
            "external_key": self.external_key,
            "own_chain_id": self.chain_id if self.own_chain_id is None else self.own_chain_id,
            "requeued": [
                {"chain_id": chain, "state": state} for chain, state in self.requeued.items()
            ],
            "rows": [_jsonable(dataclasses.asdict(row)) for row in self.rows],
        }


@dataclass(frozen=True)
class DeadTask:
    """A dead-letter run: the task it came from (``task_id``), and the
    chain requeued from it (``requeued_as``, None: not requeued)."""

    dead_id: int
    task_id: int
    process: str | None
    status: str | None
    went_dead_at: dt.datetime | None
    message: str | None
    requeued_as: int | None


# ---------------------------------------------------------------- reading


def queue_status(
    bind: Bind,
    queue: Queue,
    *,
    window_seconds: float = 300.0,
    running: int = 20,
    failures: int = 10,
    now: dt.datetime | None = None,
    periodic: Sequence[Periodic] = (),
    exact: bool = False,
) -> QueueStatus:
    """What ``queue`` is doing (see the module): chain counts per process
    (and tenant), the oldest ready task's age, the attempts finished in the
    last ``window_seconds``, up to ``running`` running tasks and the
    ``failures`` newest failures, on PostgreSQL the table's storage, and
    the ``periodic`` tasks of a worker class with their last and next run.

    The finished states are counted per range of ids and the counts kept
    in the queue's configuration table (``status_summary.py``): a range is
    counted again only when it may have changed. ``exact`` counts every
    range again (what a change by hand, outside sqla-queue, may need)."""
    if window_seconds <= 0:
        raise ConfigurationError(f"window_seconds must be positive, not {window_seconds}")
    table = resolve_table(queue)
    now = now or utcnow()
    with _connection(bind) as conn:
        adapter = _adapter(conn, table)
        queries = adapter.inspection
        open_groups = queries.open_groups(conn)
        since = now - dt.timedelta(seconds=window_seconds)
        closed_groups = status_summary.closed_groups(
            conn, queries, since=since, now=now, exact=exact
        )
        engine = conn.engine
        running_rows = queries.running(conn, limit=running) if running else []
        failure_rows = queries.newest_failures(conn, limit=failures) if failures else []
        table_health = adapter.table_health(conn)
        lock_holders = adapter.routine_lock_holders(
            conn, keys={routine_key(name): name for name in ROUTINES}
        )
        # the model names its configuration table (__queue_configuration__)
        paused = paused_processes(conn, queue if isinstance(queue, type) else table)
        runs = (
            last_runs(conn, adapter, configuration_table_of(queue))
            if periodic and isinstance(queue, type)
            else {}
        )
    # the finished states' counts kept for the next call, now that the reads
    # are over (status_summary.py)
    status_summary.save_counted(engine, queries, own=isinstance(bind, Engine))
    processes: dict[str, Counts] = {}
    tenant_processes: dict[str, dict[str, Counts]] = {}
    oldest: dt.datetime | None = None
    # a paused process's tasks wait on purpose: not the oldest ready one
    paused_waiting: set[str] = set()
    for row in open_groups:
        state = _open_state(row)
        if state is None:
            continue
        _count(processes, tenant_processes, row, state, row.n)
        if state == "ready" and row.oldest is not None:
            if _name(row.processo) in paused:
                paused_waiting.add(_name(row.processo))
            else:
                oldest = row.oldest if oldest is None else min(oldest, row.oldest)
    recent: dict[str, list[int]] = {}
    for row in closed_groups:
        state = _closed_state(row)
        if state is not None:
            _count(processes, tenant_processes, row, state, row.n)
        done = int(row.recent or 0)
        if done:
            # finished, succeeded, failed, cancelled: attempts
            numbers = recent.setdefault(_name(row.processo), [0, 0, 0, 0])
            numbers[0] += done
            if row.status == _SUCCEEDED:
                numbers[1] += done
            elif row.cancelled:
                numbers[3] += done
            elif row.status in _FAILED:
                numbers[2] += done
    totals = Counts.sum(processes.values())
    tenants = {tenant: Counts.sum(by.values()) for tenant, by in tenant_processes.items()}
    recent_by_process = {
        name: Throughput(window_seconds, *numbers) for name, numbers in sorted(recent.items())
    }
    throughput = Throughput(
        window_seconds,
        sum(t.finished for t in recent_by_process.values()),
        sum(t.succeeded for t in recent_by_process.values()),
        sum(t.failed for t in recent_by_process.values()),
        sum(t.cancelled for t in recent_by_process.values()),
    )
    return QueueStatus(
        queue=_table_name(table),
        processes=dict(sorted(processes.items())),
        totals=totals,
        tenants=dict(sorted(tenants.items())),
        tenant_processes=tenant_processes,
        oldest_ready_seconds=None if oldest is None else max(0.0, (now - oldest).total_seconds()),
        throughput=throughput,
        throughput_by_process=recent_by_process,
        running=[_running(row, now) for row in running_rows],
        failures=[_failure(row) for row in failure_rows],
        health=None
        if table_health is None
        else Health(table_health, _horizon_warning(table_health)),
        taken_at=now,
        paused=paused,
        periodic=next_runs(periodic, runs, now),
        routine_locks=lock_holders,
        oldest_ready_paused_left_out=len(paused_waiting),
    )


def task_timeline(bind: Bind, queue: Queue, task_id: int) -> Timeline:
    """The chain of the task with id ``task_id`` (any of its attempts, its
    dead-letter run's or a requeued chain's ids work too), as a timeline.
    Raises :class:`~sqla_queue.common.exceptions.TaskNotFoundError` when no row
    has that id."""
    table = resolve_table(queue)
    with _connection(bind) as conn:
        queries = _inspection(conn, table)
        row = queries.task_row(conn, task_id=task_id)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id} in {_table_name(table)}")
        # the family: the first attempt of the task the row belongs to
        # (a dead-letter run and a requeued chain carry it as live_id)
        key = row.live_id if row.live_id is not None else (row.id_inicial or row.id)
        own = [r for r in queries.chain_rows(conn, keys=[key]) if not r.dead and r.live_id is None]
        related = queries.live_rows(conn, keys=[key])
        heads = [r.id for r in related if r.id_inicial is None]
        related_ids = {r.id for r in related}
        related += [r for r in queries.chain_rows(conn, keys=heads) if r.id not in related_ids]
        family = own + related
        publications = [r.id for r in family if r.pub_sub and r.status == _SUCCEEDED]
        copies = queries.copies(conn, publications=publications)
        copy_ids = {r.id for r in copies}
        copy_heads = [r.id for r in copies if r.id_inicial is None]
        copies += [r for r in queries.chain_rows(conn, keys=copy_heads) if r.id not in copy_ids]
    rows = [_attempt("attempt", r) for r in own]
    rows += [_attempt("dead_letter" if r.dead else "requeued", r) for r in related]
    rows += [_attempt("copy", r) for r in copies]
    rows.sort(key=lambda item: item.id)
    # the state of the asked row's chain: the task's own, a dead-letter
    # run's or a requeued chain's (each counted apart by queue_status)
    own_chain = row.id_inicial or row.id
    chains: dict[int, list[Any]] = {}
    for r in sorted(family, key=lambda r: r.id):
        chains.setdefault(r.id_inicial or r.id, []).append(r)
    requeued = {
        head: _chain_state(chains[head])
        for head in sorted(chains)
        if head != key and not chains[head][0].dead
    }
    return Timeline(
        task_id=task_id,
        chain_id=key,
        state=_chain_state(chains.get(own_chain) or [row]),
        process=row.processo,
        rows=rows,
        external_key=row.chave_externa,
        own_chain_id=own_chain,
        requeued=requeued,
    )


def dead_letter(bind: Bind, queue: Queue, *, limit: int = 50) -> list[DeadTask]:
    """The newest dead-letter runs (by the id of the task they came from),
    up to ``limit``, each with the chain requeued from it if any."""
    table = resolve_table(queue)
    with _connection(bind) as conn:
        rows = _inspection(conn, table).dead_letters(conn, limit=limit * 3)
    requeued: dict[int, int] = {}
    for row in rows:
        if not row.dead:
            requeued.setdefault(row.live_id, row.id)
    return [
        DeadTask(
            dead_id=row.id,
            task_id=row.live_id,
            process=row.processo,
            status=row.status,
            went_dead_at=row.data_hora,
            message=row.mensagem,
            requeued_as=requeued.get(row.live_id),
        )
        for row in rows
        if row.dead
    ][:limit]


def recent_copies(bind: Bind, queue: Queue, *, limit: int = 50) -> list[Attempt]:
    """The newest attempts of pub/sub copies and webhook deliveries (among
    the newest 100,000 attempts), newest first."""
    table = resolve_table(queue)
    with _connection(bind) as conn:
        rows = _inspection(conn, table).newest_copies(conn, limit=limit)
    return [_attempt("copy", row) for row in rows]


def attempt_state(status: str | None, message: str | None, requeued: bool | None) -> str | None:
    """What became of one attempt (:data:`ATTEMPT_STATES`), from its
    ``status``, ``mensagem`` and ``reenfileirado``; None for a status
    sqla-queue does not write."""
    if status == _PENDING:
        return "ready"
    if status == _SCHEDULED:
        return "scheduled"
    if status == _PROCESSING:
        return "running"
    if status == _SUCCEEDED:
        return "succeeded"
    if status == Status.FAILED_PROCESSING.value:
        return "rescued"
    if status == Status.FAILED.value:
        if requeued:
            return "retried"
        return "cancelled" if message in CANCELLED_MESSAGES else "failed"
    return None


def message_gloss(message: str | None) -> str | None:
    """sqla-queue's own fixed ``mensagem`` texts (schema/rows.py) in
    English, for a person: a whole text, or an error followed by one of
    the failure suffixes (the error itself is left as it is). None for any
    other text (a handler's own message, an error alone)."""
    if not message:
        return None
    text = message.strip()
    if text in MESSAGE_GLOSSES:
        return MESSAGE_GLOSSES[text]
    expired = expiry_gloss(text)
    if expired is not None:
        return expired
    for suffix, gloss in SUFFIX_GLOSSES.items():
        # failure_message drops the suffix's period after an error's own
        bare = suffix.removeprefix(".")
        if text.endswith(bare):
            cause = MESSAGE_GLOSSES.get(text[: -len(bare)].rstrip().removesuffix("."))
            return gloss if cause is None else f"{cause}; {gloss}"
    return None


def describe_age(seconds: float | None) -> str:
    """``seconds`` for a person: 850 ms, 12.5 s, 3.2 min, 1.5 h, 2.0 d."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# ---------------------------------------------------------------- helpers


@contextlib.contextmanager
def _connection(bind: Bind) -> Iterator[Connection]:
    if isinstance(bind, Session):
        yield bind.connection()
    elif isinstance(bind, Connection):
        yield bind
    elif isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
    else:
        raise ConfigurationError(
            "give a SQLAlchemy Session, Connection or Engine, "
            f"not {type(bind).__module__}.{type(bind).__qualname__}"
        )


def _adapter(conn: Connection, table: Table) -> Adapter:
    # no task locks: the inspection reads and takes no task
    return adapter_of(conn.dialect, table, task_locks=False)


def _inspection(conn: Connection, table: Table) -> InspectionQueries:
    return _adapter(conn, table).inspection


def _table_name(table: Table) -> str:
    return table.name if table.schema is None else f"{table.schema}.{table.name}"


def _name(process: str | None) -> str:
    """A process's key in the counts (a task without processo: "")."""
    return process or ""


def _state_of(status: str | None, attempt: int | None, message: str | None = None) -> str | None:
    later = (attempt or 1) > 1
    if status == _PENDING:
        return "retrying" if later else "ready"
    if status == _SCHEDULED:
        return "retrying" if later else "scheduled"
    if status == _PROCESSING:
        return "running"
    if status == _SUCCEEDED:
        return "succeeded"
    if status == Status.FAILED.value and message in CANCELLED_MESSAGES:
        return "cancelled"  # the same test as adapters/inspection.cancelled_attempt
    if status in _FAILED:
        return "failed"
    return None


def _chain_state(chain: Sequence[Any]) -> str:
    """The state of a chain (its rows, oldest first) as queue_status counts
    it: a dead-letter run's, ``dead_letter``; else its newest attempt's,
    the one no retry followed (adapters/inspection.task_state)."""
    head = chain[0]
    if head.dead:
        return task_state(head) or "unknown"
    newest = next((r for r in reversed(chain) if not r.reenfileirado), chain[-1])
    state = task_state(newest) or _state_of(newest.status, newest.tentativa, newest.mensagem)
    return state or "unknown"


def _open_state(row: Any) -> str | None:
    if row.dead:
        return "dead_letter" if row.head else None
    return _state_of(row.status, 2 if row.later else 1)


def _closed_state(row: Any) -> str | None:
    if row.dead:
        return "dead_letter" if row.head else None
    if row.requeued:
        return None  # an attempt with a newer one after it
    if row.cancelled:
        return "cancelled"
    return _state_of(row.status, 1)


def _count(
    processes: dict[str, Counts],
    tenant_processes: dict[str, dict[str, Counts]],
    row: Any,
    state: str,
    n: int,
) -> None:
    name = _name(row.processo)
    processes.setdefault(name, Counts()).add(state, int(n))
    if row.tenant is not None:
        by = tenant_processes.setdefault(str(row.tenant), {})
        by.setdefault(name, Counts()).add(state, int(n))


def _running(row: Any, now: dt.datetime) -> RunningTask:
    started = row.started_at
    return RunningTask(
        id=row.id,
        chain_id=row.id_inicial or row.id,
        process=row.processo,
        tenant=row.tenant,
        attempt=row.tentativa or 1,
        dead=bool(row.dead),
        worker_id=row.worker_id,
        started_at=started,
        lease_expires_at=row.lease_expires_at,
        running_seconds=None if started is None else max(0.0, (now - started).total_seconds()),
    )


def _failure(row: Any) -> Failure:
    return Failure(
        id=row.id,
        chain_id=row.id_inicial or row.id,
        process=row.processo,
        tenant=row.tenant,
        attempt=row.tentativa or 1,
        dead=bool(row.dead),
        status=row.status,
        message=row.mensagem,
        finished_at=row.finished_at,
        worker_id=row.worker_id,
    )


def _attempt(kind: str, row: Any) -> Attempt:
    return Attempt(
        kind=kind,
        id=row.id,
        chain_id=row.id_inicial or row.id,
        attempt=row.tentativa or 1,
        status=row.status,
        dead=bool(row.dead),
        process=row.processo,
        subscriber_id=row.subscriber_id,
        run_at=row.data_hora,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker_id=row.worker_id,
        message=row.mensagem,
        traceback=getattr(row, "error_traceback", None),
        state=attempt_state(row.status, row.mensagem, getattr(row, "reenfileirado", None)),
    )


def _horizon_warning(health: TableHealth) -> str | None:
    held = health.horizon_seconds
    if held is not None and held >= HORIZON_WARN_SECONDS:
        return (
            f"{health.horizon_holder} has held the vacuum horizon for {held:.0f} s: "
            "no dead row version since then can be removed, and the claims slow "
            "down as they pile up"
        )
    if health.horizon_others:
        return f"{'; '.join(health.horizon_others)} holds the vacuum horizon"
    return None


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value.isoformat() if isinstance(value, dt.datetime) else value
        for key, value in data.items()
    }
