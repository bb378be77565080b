"""Unique tasks: at most one live task per process and external key.

A queue model declares which processes are unique, each with a policy and
an optional period::

    class Task(QueueMixin, Base):
        __tablename__ = "fila"
        __queue_unique__ = (
            Unique("faturar", policy="skip", period=dt.timedelta(hours=1)),
            Unique("recalcular", policy="replace"),
        )

A new task of a declared process that has an external key
(``chave_externa``) is a *duplicate* when a task with the same process,
tenant and external key is still waiting (``pendente``, ``agendada``,
retries included), running (``processando``), or, with a ``period``,
succeeded less than ``period`` after it was enqueued. A failed, cancelled
or purged task, or one that succeeded longer ago than the period, does
not count. Tasks without an external key are never duplicates.

The policy says what a duplicate does, at enqueue, in the enqueuing
transaction:

- ``skip``: nothing is enqueued. ``QueueClient.insert_task`` returns the
  existing task's id; an ORM ``Task`` added to a session is taken out of
  it at flush and :func:`duplicate_of` gives the existing task's id.
- ``replace``: as ``skip``, and a waiting duplicate takes the new task's
  payload, run time and priority (a running or succeeded one is left as it
  is: there is nothing to replace).
- ``error``: ``DuplicateTaskError`` (the flush, or the call, fails).

How it holds under concurrent enqueues, on every database: a table of its
own beside the queue table, ``<table>_unique``, has one row per key (a
SHA-256 of process, tenant and key) naming the task that holds it. An
enqueue inserts that row unless it exists (an upsert); the database's
primary key makes a second enqueue of the same key wait for the first's
transaction, and only then does it read who holds the key (a locking
read, so that MariaDB's REPEATABLE READ sees the newest row).
A key whose task no longer counts is taken over in place. Under
PostgreSQL's REPEATABLE READ a key taken by a transaction that committed
after the enqueuing one began cannot be read; the enqueue then fails with
``DuplicateTaskError`` asking to retry the transaction.

The policies are applied to the application's enqueues (the ORM flush
hook and ``QueueClient``'s inserts on a client built from the model) and a
requeue of dead tasks refuses a duplicate (requeue.py); a worker's retries
and dead-letter runs belong to the chain that holds the key. Every other
way a live task could get a key (a Core or ORM bulk INSERT, an UPDATE of
``chave_externa``, a client built from a table name, Spark) meets the
database's own guard: the *live-key index* ``ix_<table>_unica``, made with
the table (adapters/unique.py: a partial unique index on PostgreSQL and
SQLite, a generated column with a unique index on the MySQL family), which
refuses a second live task with the same key at once, whatever the
isolation level; its violation raises the same ``DuplicateTaskError``
(a ``handle_error`` listener on every engine). It guards the live tasks
only: the period is the key table's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    String,
    Table,
    event,
    inspect,
)
from sqlalchemy.orm import Mapper, Session

from ..adapters import adapter_of
from ..adapters.unique import (
    UniqueQueries,
    live_index_name,
    live_key_create,
    refused_by_live_index,
)
from ..common.exceptions import ConfigurationError, DuplicateTaskError
from ..common.identifiers import derived_identifier
from ..common.types import UtcDateTime
from ..schema.mixins import OPEN_STATUSES, QueueMixin, Status

__all__ = [
    "Decision",
    "Unique",
    "admit",
    "bind",
    "declare",
    "duplicate_of",
    "live_index_name",
    "policies_of",
    "unique_table",
]

Policy = Literal["skip", "replace", "error"]
POLICIES: tuple[str, ...] = ("skip", "replace", "error")
#: the Table.info key holding a queue table's declarations
_INFO = "sqla_queue_unique"
_DUPLICATE = "_sqla_queue_duplicate_of"
_WAITING = (Status.PENDING.value, Status.SCHEDULED.value)
_TRIES = 3
#: whether any model declared unique processes (the flush hook's quick test)
declared_any = False


@dataclass(frozen=True)
class Unique:
    """One unique process (see the module)."""

    process: str
    policy: Policy = "skip"
    #: how long after its enqueue a succeeded task still counts; None: not at all
    period: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.process, str) or not self.process.strip():
            raise ConfigurationError(
                f"Unique: process must be a non-empty string, not {self.process!r}"
            )
        if self.policy not in POLICIES:
            raise ConfigurationError(
                f"Unique({self.process!r}): policy must be one of {', '.join(POLICIES)}, "
                f"not {self.policy!r}"
            )
        if self.period is not None and (
            not isinstance(self.period, dt.timedelta) or self.period <= dt.timedelta(0)
        ):
            raise ConfigurationError(
                f"Unique({self.process!r}): period must be a positive timedelta or None, "
                f"not {self.period!r}"
            )


@dataclass(frozen=True)
class Decision:
    """What an enqueue of a unique task does: ``key`` None (not unique),
    or a new key to bind to the task once inserted, or a duplicate of
    ``existing`` (skipped, or ``replaced``)."""

    key: str | None
    existing: int | None = None
    replaced: bool = False

    @property
    def duplicate(self) -> bool:
        return self.existing is not None


NOT_UNIQUE = Decision(None)


def declare(table: Table, declared: Any) -> None:
    """Check ``__queue_unique__`` and add ``<table>_unique`` to the table's
    MetaData (made and dropped with it)."""
    items = tuple(declared or ())
    if not items:
        return
    if not all(isinstance(item, Unique) for item in items):
        raise ConfigurationError(
            f"{table.name}.__queue_unique__ must be a tuple of sqla_queue.Unique, not {declared!r}"
        )
    by_process: dict[str, Unique] = {}
    for item in items:
        if item.process in by_process:
            raise ConfigurationError(
                f"{table.name}.__queue_unique__ names process {item.process!r} twice"
            )
        by_process[item.process] = item
    table.info[_INFO] = by_process
    unique_table(table)
    if not event.contains(table, "after_create", _create_live_key):
        event.listen(table, "after_create", _create_live_key)
    global declared_any
    declared_any = True


def _create_live_key(table: Table, connection: Any, **kw: Any) -> None:
    """``create_all()``'s (and ``sqla-queue ddl``'s) live-key index, after
    the queue table (adapters/unique.py: partial unique index, or generated
    column and unique index)."""
    live_key_create(connection, table, tuple(policies_of(table)))


# every engine: a live-key index's violation is the flush hook's error
event.listen(Engine, "handle_error", refused_by_live_index)


def policies_of(table: Table) -> Mapping[str, Unique]:
    """The unique processes of a queue table (none when not declared)."""
    found: Mapping[str, Unique] = table.info.get(_INFO, {})
    return found


def unique_table(table: Table) -> Table:
    """``<table>_unique``: one row per key, the task that holds it."""
    name = derived_identifier(table.name, "unique", "")
    key = f"{table.schema}.{name}" if table.schema else name
    metadata = table.metadata
    if key in metadata.tables:
        return metadata.tables[key]
    return Table(
        name,
        metadata,
        Column("unique_key", String(64), primary_key=True),
        Column("task_id", BigInteger().with_variant(Integer, "sqlite")),
        Column("taken_at", UtcDateTime, nullable=False),
        schema=table.schema,
        info={"sqla_queue_unique_of": table.name},
    )


def key_of(process: str, tenant: Any, external_key: Any) -> str:
    raw = json.dumps(
        [process, None if tenant is None else str(tenant), str(external_key)],
        ensure_ascii=False,
    )
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def admit(
    conn: Connection,
    table: Table,
    row: Mapping[str, Any],
    now: dt.datetime,
    *,
    refuse: bool = False,
) -> Decision:
    """Whether the task ``row`` (seed column names) may be enqueued, in the
    caller's transaction: NOT_UNIQUE, a new key (taken: :func:`bind` it to
    the task's id once inserted), or a duplicate, replaced if the policy
    says so; raises ``DuplicateTaskError`` under the ``error`` policy, and
    for any duplicate with ``refuse`` (a requeue: requeue.py)."""
    rule = policies_of(table).get(str(row.get("processo")))
    external_key = row.get("chave_externa")
    if rule is None or external_key is None:
        return NOT_UNIQUE
    queries = _queries(conn, table)
    key = key_of(rule.process, row.get("tenant"), external_key)
    for _ in range(_TRIES):
        queries.reserve(conn, key, now)
        held = queries.held(conn, key)
        if held is None:
            continue  # REPEATABLE READ: inserted by a transaction this one cannot see
        newest = None if held.task_id is None else queries.newest_attempt(conn, held.task_id)
        if (
            held.task_id is not None
            and _same_key(newest, rule, row)
            and _counts(newest, held.taken_at, rule, now)
        ):
            return _duplicate(
                conn, queries, rule, row, key, int(held.task_id), newest, now, refuse=refuse
            )
        # free: the row just inserted (a key is bound to its task in the
        # transaction that takes it), one left by a transaction that
        # committed without its task, or a task that no longer counts
        queries.take(conn, key, now)
        return Decision(key)
    raise DuplicateTaskError(
        f"process {rule.process!r}, external key {external_key!r}: a concurrent transaction "
        "holds the key and this one cannot see it (REPEATABLE READ?): retry the transaction"
    )


def bind(conn: Connection, table: Table, decision: Decision, task_id: int) -> None:
    """The new key of ``decision`` now names task ``task_id``."""
    if decision.key is None or decision.duplicate:
        return
    _queries(conn, table).bind(conn, decision.key, task_id)


def _queries(conn: Connection, table: Table) -> UniqueQueries:
    return adapter_of(conn.dialect, table).unique(unique_table(table))


def duplicate_of(task: Any) -> int | None:
    """The id of the task an ORM ``Task`` was a duplicate of (it was not
    enqueued: see the module); None when it was enqueued."""
    found = task.__dict__.get(_DUPLICATE)
    if isinstance(found, QueueMixin):  # a task of the same flush
        found = found.__dict__.get("id")
    return None if found is None else int(found)


# ------------------------------------------------------------ the ORM path
_PENDING = "sqla_queue_unique_pending"


def admit_new_tasks(
    session: Session, tasks: list[QueueMixin], now: dt.datetime
) -> list[QueueMixin]:
    """The flush hook's step (events.py): each new task of a unique process
    admitted, or taken out of the session as a duplicate (``skip``,
    ``replace``); the tasks to write. The keys taken are bound to the
    tasks' ids after the flush."""
    kept: list[QueueMixin] = []
    seen: dict[tuple[str, str], QueueMixin] = {}
    for task in tasks:
        table = inspect(task).mapper.local_table
        if not isinstance(table, Table) or not policies_of(table) or task.external_key is None:
            kept.append(task)
            continue
        row = _row_of(task)
        rule = policies_of(table).get(str(task.process))
        if rule is None:
            kept.append(task)
            continue
        own = (table.fullname, key_of(rule.process, task.tenant, task.external_key))
        first = seen.get(own)
        if first is not None:  # the same key twice in one flush: the first holds it
            if rule.policy == "error":
                raise DuplicateTaskError(
                    f"process {rule.process!r}, external key {task.external_key!r}: "
                    "added twice in one flush (unique, policy 'error')"
                )
            _drop(session, task, first)
            continue
        conn = session.connection(bind_arguments={"mapper": inspect(task).mapper})
        decision = admit(conn, table, row, now)
        if decision.duplicate:
            assert decision.existing is not None
            _drop(session, task, decision.existing)
            continue
        seen[own] = task
        session.info.setdefault(_PENDING, []).append((table, decision, task))
        kept.append(task)
    return kept


def _row_of(task: QueueMixin) -> dict[str, Any]:
    """A prepared task's values under the seed's column names."""
    return {
        "processo": task.process,
        "tenant": task.tenant,
        "chave_externa": task.external_key,
        "payload": task.payload_text,
        "payload_hash": task.payload_hash,
        "prioridade": task.priority,
        "data_hora": task.run_at,
        "trace_context": task.__dict__.get("trace_context"),
    }


def _drop(session: Session, task: QueueMixin, existing: Any) -> None:
    session.expunge(task)
    task.__dict__[_DUPLICATE] = existing


def bind_written(session: Session) -> None:
    """Bind the keys of the admitted tasks that have their id now: those
    the flush hook wrote itself (right after it, events.py), the others
    after the flush."""
    pending = session.info.get(_PENDING)
    if not pending:
        return
    left = []
    for table, decision, task in pending:
        task_id = task.__dict__.get("id")
        if task_id is None:
            left.append((table, decision, task))
            continue
        conn = session.connection(bind_arguments={"mapper": inspect(task).mapper})
        bind(conn, table, decision, int(task_id))
    session.info[_PENDING] = left


@event.listens_for(Session, "after_flush")
def _bind_pending(session: Session, flush_context: Any) -> None:
    bind_written(session)


@event.listens_for(Session, "after_rollback")
def _forget_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)


@event.listens_for(QueueMixin, "after_mapper_constructed", propagate=True)
def _declare(mapper: Mapper[Any], cls: type[QueueMixin]) -> None:
    table = mapper.local_table
    declared = getattr(cls, "__queue_unique__", None)
    if declared and isinstance(table, Table) and mapper.inherits is None:
        declare(table, declared)


def _same_key(newest: Any, rule: Unique, row: Mapping[str, Any]) -> bool:
    """Whether the chain that holds the key still has it: an UPDATE of its
    ``chave_externa`` (or process, or tenant) frees the key it had."""
    if newest is None or newest.chave_externa is None:
        return False
    return key_of(str(newest.processo), newest.tenant, newest.chave_externa) == key_of(
        rule.process, row.get("tenant"), row.get("chave_externa")
    )


def _counts(newest: Any, taken_at: dt.datetime, rule: Unique, now: dt.datetime) -> bool:
    """Whether the chain whose newest attempt is ``newest`` makes a new
    task a duplicate."""
    if newest is None:
        return False
    if newest.status in OPEN_STATUSES:
        return True
    if newest.status != Status.SUCCEEDED.value or rule.period is None:
        return False
    if taken_at.tzinfo is None:
        taken_at = taken_at.replace(tzinfo=dt.timezone.utc)
    return now - taken_at < rule.period


def _duplicate(
    conn: Connection,
    queries: UniqueQueries,
    rule: Unique,
    row: Mapping[str, Any],
    key: str,
    existing: int,
    newest: Any,
    now: dt.datetime,
    *,
    refuse: bool = False,
) -> Decision:
    if rule.policy == "error" or refuse:
        raise DuplicateTaskError(
            f"process {rule.process!r}, external key {row.get('chave_externa')!r}: "
            f"task {existing} is {newest.status} (unique, policy {rule.policy!r})"
        )
    replaced = False
    if rule.policy == "replace" and newest.status in _WAITING:
        replaced = _replace(conn, queries, int(newest.id), row, now)
    return Decision(key, existing=existing, replaced=replaced)


#: what a replacement takes from the new task (its run time and status apart)
_REPLACED = ("payload", "payload_hash", "prioridade", "trace_context")


def _replace(
    conn: Connection, queries: UniqueQueries, attempt: int, row: Mapping[str, Any], now: dt.datetime
) -> bool:
    """The waiting attempt ``attempt`` takes the new task's payload,
    priority and run time (now when it has none); False when it was
    claimed meanwhile."""
    values: dict[str, Any] = {name: row[name] for name in _REPLACED if row.get(name) is not None}
    run_at = row.get("data_hora") or now
    values["data_hora"] = run_at
    values["status"] = Status.SCHEDULED.value if run_at > now else Status.PENDING.value
    return queries.replace_waiting(conn, attempt, values)
