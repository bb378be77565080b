"""``QueueClient``: the seed's SDK calls, in the caller's transaction.

Code written for nsj-queue-lib ports by changing the import::

    client = QueueClient(session, "fila_faturamento")
    client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})

Parameters keep the seed's names and order; English keyword aliases work too
(``process=``, ``external_key=``, ``run_at=``, ``priority=``...). Nothing here
commits: the rows are written on the caller's Session or Connection and
commit or roll back with it. Unlike the reference, every insert returns the
new ids.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table
from sqlalchemy.orm import DeclarativeBase, Session

from ..adapters import Adapter, adapter_of
from ..common.exceptions import ConfigurationError, InvalidTaskError
from ..common.identifiers import split_table_name
from ..common.payload import hash_payload, serialize_payload
from ..common.stamps import fill as fill_stamps
from ..common.types import utcnow
from ..enqueue import unique
from ..schema.mixins import COLUMN_NAMES, DEFAULT_PRIORITY, QueueMixin, Status
from ..schema.payload_keys import values_for
from ..schema.records import TaskRecord
from ..schema.validation import check_columns

if TYPE_CHECKING:
    from ..common.progress import Progress
    from .requeue import Requeued
    from .workflow import Workflow

__all__ = ["QueueClient", "resolve_table"]

DEFAULT_EQUIVALENT_STATUSES = ("sucesso", "pendente", "agendada")
_SEED_PARAMETERS = (
    "origem",
    "destino",
    "processo",
    "chave_externa",
    "payload",
    "tenant",
    "grupo_empresarial",
    "data_hora",
    "prioridade",
)
#: the seed parameters' English names (QueueClient and the models take both)
_ALIASES = {
    name: COLUMN_NAMES[name]
    for name in (
        "origin",
        "destination",
        "process",
        "external_key",
        "company_group",
        "run_at",
        "priority",
    )
}


class _ClientBase(DeclarativeBase):
    """Private registry for tables named by string."""


_tables: dict[tuple[str | None, str], type[QueueMixin]] = {}
_tables_lock = threading.Lock()


def resolve_table(name: str | type[QueueMixin] | Table) -> Table:
    """The queue table for a model, a Table, or a (schema-qualified) name."""
    if isinstance(name, Table):
        return name
    if isinstance(name, type) and issubclass(name, QueueMixin):
        return name.__table__  # type: ignore[attr-defined,no-any-return]
    schema, table = split_table_name(name)  # type: ignore[arg-type]
    with _tables_lock:
        if (schema, table) not in _tables:
            _tables[(schema, table)] = type(  # type: ignore[assignment]
                f"_Queue_{schema}_{table}",
                (QueueMixin, _ClientBase),
                {"__tablename__": table, "__table_args__": {"schema": schema}},
            )
        return _tables[(schema, table)].__table__  # type: ignore[attr-defined,no-any-return]


_KEYS = {**{name: name for name in _SEED_PARAMETERS}, **_ALIASES}


_GIVEN_TWICE = "an argument is given twice (seed and English names name one parameter)"
# seed names for each key tuple seen in a mapping (bounded: key tuples are few)
_NAME_PLANS: dict[tuple[Any, ...], tuple[str, ...]] = {}


def _seed_names(keys: tuple[Any, ...]) -> tuple[str, ...]:
    names = _NAME_PLANS.get(keys)
    if names is None:
        try:
            names = tuple(_KEYS[key] for key in keys)
        except KeyError as exc:
            raise TypeError(f"unexpected argument {exc.args[0]!r}") from None
        if len(set(names)) < len(names):
            raise TypeError(_GIVEN_TWICE)
        if len(_NAME_PLANS) < 1024:
            _NAME_PLANS[keys] = names
    return names


def _normalise(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Seed parameter names for positional and keyword (seed or English) values."""
    if len(args) > len(_SEED_PARAMETERS):
        raise TypeError(f"at most {len(_SEED_PARAMETERS)} positional arguments")
    if not kwargs:  # the seed's own calls: positional only
        return dict(zip(_SEED_PARAMETERS, args, strict=False))
    values = dict(zip(_seed_names(tuple(kwargs)), kwargs.values(), strict=True))
    if args:
        if any(name in values for name in _SEED_PARAMETERS[: len(args)]):
            raise TypeError(_GIVEN_TWICE)
        values.update(zip(_SEED_PARAMETERS, args, strict=False))
    return values


def _task_row(values: dict[str, Any], *, pub_sub: bool, now: dt.datetime) -> dict[str, Any]:
    check_columns(values)
    get = values.get
    text = serialize_payload(get("payload"))
    run_at = get("data_hora")
    if run_at is not None and run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=dt.timezone.utc)
    priority = get("prioridade")
    row = {
        "origem": get("origem"),
        "destino": get("destino"),
        "processo": get("processo"),
        "chave_externa": get("chave_externa"),
        "payload": text,
        "payload_hash": hash_payload(text),
        "tenant": get("tenant"),
        "grupo_empresarial": get("grupo_empresarial"),
        "prioridade": DEFAULT_PRIORITY if priority is None else priority,
        "pub_sub": pub_sub,
        "status": _SCHEDULED if run_at is not None and run_at > now else _PENDING,
    }
    if run_at is not None:  # else both take the database's clock
        row["data_hora"] = run_at
        row["data_hora_inicial"] = run_at
    return row


_SCHEDULED = Status.SCHEDULED.value
_PENDING = Status.PENDING.value


class QueueClient:
    """Enqueue on ``session_or_connection`` (a Session or a Connection) into
    ``table`` (a model, a Table, or a table name, optionally ``schema.table``).

    nsj-queue-lib's keyword names ``bd_conn``, ``queue_table`` and
    ``queue_subscriber_table`` are accepted too, so its calls port unchanged."""

    def __init__(
        self,
        session_or_connection: Session | Connection | None = None,
        table: str | type[QueueMixin] | Table | None = None,
        subscriber_table: str | None = None,
        *,
        bd_conn: Session | Connection | None = None,
        queue_table: str | type[QueueMixin] | Table | None = None,
        queue_subscriber_table: str | None = None,
    ) -> None:
        conn, queue, subscribers = _constructor_arguments(
            "QueueClient",
            "a Session or Connection",
            (session_or_connection, table, subscriber_table),
            (bd_conn, queue_table, queue_subscriber_table),
        )
        if not isinstance(conn, (Session, Connection)):
            module = type(conn).__module__
            raise ConfigurationError(
                "QueueClient needs a SQLAlchemy Session or Connection, "
                f"not {module}.{type(conn).__qualname__}"
                + (": use sqla_queue.AsyncQueueClient" if module.startswith(_ASYNCIO) else "")
            )
        self.session_or_connection = conn
        self.table = resolve_table(queue)
        if subscribers is not None:
            split_table_name(subscribers)
        self.subscriber_table = subscribers

    @property
    def bd_conn(self) -> Session | Connection:
        """nsj-queue-lib's name for :attr:`session_or_connection`."""
        return self.session_or_connection

    @property
    def connection(self) -> Connection:
        if isinstance(self.session_or_connection, Session):
            return self.session_or_connection.connection()
        return self.session_or_connection

    def _adapter(self, conn: Connection) -> Adapter:
        return adapter_of(conn.dialect, self.table)

    def _task_row(
        self, values: dict[str, Any], *, pub_sub: bool, now: dt.datetime
    ) -> dict[str, Any]:
        """The row of one task, with the columns the model fills from
        payload keys (payload_keys.py)."""
        row = _task_row(values, pub_sub=pub_sub, now=now)
        keyed = values_for(self.table, values.get("payload"))
        if keyed:
            row.update(keyed)
        return row

    # ------------------------------------------------------------- inserts
    def insert_task(self, *args: Any, **kwargs: Any) -> int:
        """Enqueue one task; returns its id. Parameters: ``origem, destino,
        processo, chave_externa, payload, tenant=None, grupo_empresarial=None,
        data_hora=None, prioridade=None`` (or their English names)."""
        now = utcnow()
        row = self._task_row(_normalise(args, kwargs), pub_sub=False, now=now)
        fill_stamps([row])
        return self._insert_one(row, now)

    def _insert_one(self, row: dict[str, Any], now: dt.datetime) -> int:
        """Insert ``row``; a unique task (``__queue_unique__``) is admitted
        first, and a duplicate returns the existing task's id (unique.py)."""
        conn = self.connection
        if not unique.policies_of(self.table):  # the usual table: nothing to admit
            return self._adapter(conn).task_insert_one(conn, row=row)
        decision = unique.admit(conn, self.table, row, now)
        if decision.duplicate:
            assert decision.existing is not None
            return decision.existing
        new_id = self._adapter(conn).task_insert_one(conn, row=row)
        unique.bind(conn, self.table, decision, new_id)
        return new_id

    def insert_task_pub_sub(self, *args: Any, **kwargs: Any) -> int:
        """Publish one task (``pub_sub`` true); returns its id. Same
        parameters as :meth:`insert_task`. A pub/sub worker fans it out to
        the subscriptions of its ``processo`` (docs/pubsub.md); no subscriber
        table is needed here, at insert time."""
        now = utcnow()
        row = self._task_row(_normalise(args, kwargs), pub_sub=True, now=now)
        fill_stamps([row])
        return self._insert_one(row, now)

    def insert_task_webhook(self, *args: Any, **kwargs: Any) -> int:
        """Publish one task for webhook delivery: the same as
        :meth:`insert_task_pub_sub`, as in nsj-queue-lib (the subscriptions'
        ``url`` says where each copy goes)."""
        return self.insert_task_pub_sub(*args, **kwargs)

    def insert_tasks(
        self, tasks: Iterable[Mapping[str, Any]], *, pub_sub: bool = False
    ) -> list[int]:
        """Enqueue many tasks (mappings of the same parameters); returns
        their ids in order. One INSERT statement on PostgreSQL, MariaDB and
        SQLite (row by row only where the database cannot return ids)."""
        return self._insert(tasks, pub_sub=pub_sub, copy=False)

    def copy_tasks(self, tasks: Iterable[Mapping[str, Any]], *, pub_sub: bool = False) -> list[int]:
        """Like :meth:`insert_tasks`, through PostgreSQL's COPY (fastest for
        large batches); other databases raise UnsupportedOperationError."""
        return self._insert(tasks, pub_sub=pub_sub, copy=True)

    def _insert(
        self, tasks: Iterable[Mapping[str, Any]], *, pub_sub: bool, copy: bool
    ) -> list[int]:
        now = utcnow()
        rows = [self._task_row(_normalise((), task), pub_sub=pub_sub, now=now) for task in tasks]
        fill_stamps(rows)
        if unique.policies_of(self.table):
            # unique tasks one at a time, each admitted (and the batch's own
            # duplicates seen) before it is inserted
            return [self._insert_one(row, now) for row in rows]
        conn = self.connection
        adapter = self._adapter(conn)
        insert_many = adapter.task_copy_many if copy else adapter.task_insert_many
        if not any("data_hora" in row for row in rows):
            return insert_many(conn, rows=rows) if rows else []
        ids: list[int] = [0] * len(rows)
        # rows with and without data_hora are inserted apart (same keys per statement)
        for scheduled in (False, True):
            positions = [i for i, row in enumerate(rows) if ("data_hora" in row) == scheduled]
            if positions:
                new_ids = insert_many(conn, rows=[rows[i] for i in positions])
                for position, new_id in zip(positions, new_ids, strict=True):
                    ids[position] = new_id
        return ids

    # ------------------------------------------------------------- dead letter
    def requeue_dead(
        self,
        ids: Iterable[int] | None = None,
        *,
        process: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        all_dead: bool = False,
        limit: int = 10_000,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> list[Requeued]:
        """Run dead tasks again: each matching dead-letter run's task gets a
        new chain (``pendente``, attempt 1, its payload kept) linked to the
        old one by ``id_anterior`` and ``live_id``; a task is requeued once.
        ``ids`` are dead-letter rows' or original tasks' ids; ``since`` and
        ``until`` bound when the task went dead. Returns what was (with
        ``dry_run``: would be) requeued. In the caller's transaction.
        ``progress``: see :mod:`sqla_queue.common.progress`."""
        from .requeue import requeue_dead

        conn = self.connection
        return requeue_dead(
            conn,
            self._adapter(conn),
            ids=ids,
            process=process,
            since=since,
            until=until,
            all_dead=all_dead,
            limit=limit,
            dry_run=dry_run,
            progress=progress,
        )

    # ------------------------------------------------------------- operator
    def cancel(self, task_id: int) -> list[int]:
        """Cancel task ``task_id`` (the id of any of its attempts): its
        pending or scheduled attempt becomes ``falha`` "Tarefa cancelada pelo
        operador." (docs/operations.md). Returns the attempts changed; a
        running or finished task raises ``TaskStateError``, an unknown id
        ``TaskNotFoundError``. In the caller's transaction."""
        from .control import cancel_task

        conn = self.connection
        return list(cancel_task(conn, self._adapter(conn), task_id).ids)

    def cancel_process(
        self, process: str, *, older_than: dt.timedelta | None = None, limit: int = 1_000
    ) -> list[int]:
        """Cancel up to ``limit`` waiting tasks of ``process`` (first
        enqueued more than ``older_than`` ago, when given); call again until
        it returns nothing. In the caller's transaction."""
        from .control import cancel_process

        conn = self.connection
        return list(
            cancel_process(
                conn, self._adapter(conn), process, older_than=older_than, limit=limit
            ).ids
        )

    def enqueue_workflow(self, workflow: Workflow, **options: Any) -> int:
        """``workflow.enqueue(session, **options)`` (docs/workflows.md: its
        ``on_failure=``) on this client's Session: every task added and
        flushed, nothing committed; the workflow's id. Its tasks are of this
        client's table. A client on a Connection raises ConfigurationError:
        a workflow's steps are ORM tasks, which a Session writes."""
        from ..schema.steps import tasks_of

        session = self.session_or_connection
        if not isinstance(session, Session):
            raise ConfigurationError(
                "enqueue_workflow needs a client on a Session (a workflow's steps are ORM "
                "tasks), not on a Connection"
            )
        first = next(iter(tasks_of(workflow)), None)
        if first is not None and type(first).__table__.fullname != self.table.fullname:
            raise InvalidTaskError(
                f"a workflow of {type(first).__table__.fullname}'s tasks, enqueued by a "
                f"client of {self.table.fullname}"
            )
        return workflow.enqueue(session, **options)

    def cancel_workflow(self, workflow_id: int) -> list[int]:
        """Cancel workflow ``workflow_id``'s waiting steps (docs/workflows.md):
        each becomes ``falha`` "Tarefa cancelada pelo operador.", as
        :meth:`cancel` writes it. Returns the task rows changed; an unknown
        workflow raises ``TaskNotFoundError``. In the caller's transaction."""
        from .workflow import cancel_workflow

        conn = self.connection
        return cancel_workflow(conn, self._adapter(conn), workflow_id)

    def retry_now(self, task_id: int) -> int:
        """Run task ``task_id``'s scheduled attempt (a retry waiting out its
        backoff, or a task scheduled for later) now. Returns that attempt's
        id; raises ``TaskStateError`` when none is scheduled."""
        from .control import retry_now

        conn = self.connection
        return retry_now(conn, self._adapter(conn), task_id)

    # ------------------------------------------------------------- queries
    def list_equivalent_task(
        self, *args: Any, status: Sequence[str] = DEFAULT_EQUIVALENT_STATUSES, **kwargs: Any
    ) -> list[TaskRecord]:
        """Tasks already in the queue with the same origin, destination,
        process, external key, payload, tenant and company group, in one of
        ``status`` (default: sucesso, pendente, agendada)."""
        statuses = [status] if isinstance(status, str) else list(status)
        values = _normalise(args, kwargs)
        payload_hash = hash_payload(serialize_payload(values.get("payload")))
        if payload_hash is None:
            return []
        equal: dict[str, Any] = {"payload_hash": payload_hash}
        for column in (
            "chave_externa",
            "origem",
            "destino",
            "processo",
            "tenant",
            "grupo_empresarial",
        ):
            equal[column] = values.get(column)
        conn = self.connection
        rows = self._adapter(conn).task_equivalents(conn, equal=equal, statuses=statuses)
        return TaskRecord.from_rows(list(rows[0]._fields), rows) if rows else []


_ASYNCIO = "sqlalchemy.ext.asyncio."
_NAMES = ("session_or_connection", "table", "subscriber_table")
_SEED_NAMES = ("bd_conn", "queue_table", "queue_subscriber_table")


def _constructor_arguments(
    owner: str, wanted: str, values: tuple[Any, Any, Any], seed_values: tuple[Any, Any, Any]
) -> tuple[Any, str | type[QueueMixin] | Table, str | None]:
    """(connection, table, subscriber table) from a client constructor's
    arguments, each given by its name or by nsj-queue-lib's, not both."""
    chosen = []
    for name, value, seed_name, seed_value in zip(
        _NAMES, values, _SEED_NAMES, seed_values, strict=True
    ):
        if value is not None and seed_value is not None:
            raise TypeError(f"{owner}() got both {name} and {seed_name} (one parameter)")
        chosen.append(value if value is not None else seed_value)
    conn, queue, subscribers = chosen
    if conn is None or queue is None:
        raise TypeError(f"{owner}() needs {wanted} and a queue table")
    return conn, queue, subscribers
