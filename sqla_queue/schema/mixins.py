"""``QueueMixin``: a declarative mixin that makes a model a queue table.

Python attributes are English; the columns keep the names, types, defaults
and status values of nsj-queue-lib, so its tables, dashboards and workers keep
working (``docs/columns.md`` has the whole mapping)::

    class Task(QueueMixin, Base):
        __tablename__ = "fila_faturamento"
        __queue_channel__ = "fila_faturamento"   # optional, NOTIFY channel

When the class is mapped, the indexes the claim query needs are added (partial
on PostgreSQL and SQLite) and, on PostgreSQL, the ``AFTER INSERT`` trigger
that NOTIFYs the queue's channel, so ``metadata.create_all()`` builds all of it.
"""

from __future__ import annotations

import datetime as dt
import enum
import inspect
import warnings
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional, TypeVar

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    event,
    false,
    literal_column,
    or_,
    text,
)
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, Mapper, mapped_column
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from ..common.exceptions import ConfigurationError, UnpreparedTaskError
from ..common.identifiers import derived_identifier, validate_identifier
from ..common.payload import UNHASHED, PendingHash, decode_payload
from ..common.types import PayloadHash, PayloadText, UtcDateTime, utc_now
from .steps import Steps, add_parents

__all__ = [
    "COLUMN_NAMES",
    "ERROR_COLUMNS",
    "LEASE_COLUMNS",
    "OWN_COLUMNS",
    "TIMING_COLUMNS",
    "TRACEBACK_MAX_LENGTH",
    "TRACE_COLUMNS",
    "QueueMixin",
    "Status",
    "status_is",
    "status_literal",
]

DEFAULT_PRIORITY = 50
MESSAGE_MAX_LENGTH = 500  # varchar(500) in the reference DDL
WORKER_ID_MAX_LENGTH = 100
#: the columns sqla-queue adds to the seed's (a table made by nsj-queue-lib
#: needs them added before sqla-queue workers consume it: docs/lifecycle.md)
LEASE_COLUMNS = ("worker_id", "lease_expires_at")
#: when an attempt was claimed and when it ended: queue wait and run time
#: (docs/spark-report.md), which the seed's columns cannot tell
TIMING_COLUMNS = ("started_at", "finished_at")
#: why an attempt failed: its traceback (docs/operations.md)
ERROR_COLUMNS = ("error_traceback",)
#: the trace that enqueued the task (sqla_queue.ops.tracing, docs/operations.md)
TRACE_COLUMNS = ("trace_context",)
#: every column sqla-queue adds to the seed's
OWN_COLUMNS = LEASE_COLUMNS + TIMING_COLUMNS + ERROR_COLUMNS + TRACE_COLUMNS
#: error_traceback holds at most this many characters (the frames nearest
#: the error are kept)
TRACEBACK_MAX_LENGTH = 8000


class Status(str, enum.Enum):
    """The seed's status values, stored as their text."""

    SCHEDULED = "agendada"
    PENDING = "pendente"
    PROCESSING = "processando"
    FAILED = "falha"
    FAILED_PROCESSING = "falha_processando"
    SUCCEEDED = "sucesso"

    def __str__(self) -> str:
        return self.value


def status_literal(status: Status | str) -> ColumnElement[str]:
    """A status value written into the SQL text, never bound.

    PostgreSQL can use a partial index (``WHERE status = 'pendente'``) only
    for a statement whose condition implies the index's predicate, and a
    prepared statement's generic plan cannot know a bound value: it reads
    the whole table instead, and with no ANALYZE that plan stays cached for
    good. The values are the six constants of :class:`Status`, so writing
    them inline is safe (``Status(status)`` refuses anything else)."""
    return literal_column(f"'{Status(status).value}'", String)


def inline_count(name: str = "limit", big: bool = False) -> BindParameter[int]:
    """A row count (``LIMIT``, a batch size) written into the SQL text at
    execution, one statement per value, never bound.

    A prepared statement's generic plan cannot know a bound ``LIMIT`` and
    reckons with a tenth of the table, so PostgreSQL's plan cache re-plans
    it at every execution after a ``VACUUM`` (docs/benchmarks.md (g)).
    MariaDB refuses a bound ``LIMIT`` inside some subqueries."""
    return bindparam(name, type_=BigInteger if big else Integer, literal_execute=True)


#: a chain with a row in one of these is still running or waiting to run
OPEN_STATUSES = (Status.SCHEDULED.value, Status.PENDING.value, Status.PROCESSING.value)
#: the statuses of an attempt that has ended
CLOSED_STATUSES = (Status.SUCCEEDED.value, Status.FAILED.value, Status.FAILED_PROCESSING.value)


def status_is(column: Any, *statuses: Status | str) -> ColumnElement[bool]:
    """``column = 'x'`` or ``column IN ('x', 'y')``, the values inline."""
    if len(statuses) == 1:
        return column == status_literal(statuses[0])  # type: ignore[no-any-return]
    return column.in_([status_literal(status) for status in statuses])  # type: ignore[no-any-return]


_PROCESSING_LITERAL = status_literal(Status.PROCESSING)


_Task = TypeVar("_Task", bound="QueueMixin")


class QueueMixin:
    """Columns of a queue table (one row per attempt)."""

    __queue_channel__: ClassVar[str | None] = None
    #: False: no ix_<table>_equivalente, for a queue that never looks for
    #: equivalent tasks (one index write less per insert and per sucesso)
    __queue_equivalence_index__: ClassVar[bool] = True
    #: unique processes (sqla_queue.Unique, docs/unique.md): a table
    #: <table>_unique beside the queue table holds who has each key, and the
    #: live-key index ix_<table>_unica (made after the table) refuses a
    #: second live task of a key on every path
    __queue_unique__: ClassVar[tuple[Any, ...]] = ()
    #: False: no <table>_status beside the queue table (the finished
    #: states' counts that sqla-queue status keeps: status_summary.py)
    __queue_status_table__: ClassVar[bool] = True
    #: columns a worker may claim fairly by (``fair_by``, docs/fairness.md):
    #: each gets ix_<table>_justo_<column>, ready rows by key in claim order
    __queue_fair_by__: ClassVar[tuple[str, ...]] = ()
    if TYPE_CHECKING:
        __table__: ClassVar[Table]

    id: Mapped[int] = mapped_column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    initial_id: Mapped[int | None] = mapped_column("id_inicial", BigInteger)
    first_run_at: Mapped[dt.datetime | None] = mapped_column(
        "data_hora_inicial", UtcDateTime, server_default=utc_now()
    )
    run_at: Mapped[dt.datetime | None] = mapped_column(
        "data_hora", UtcDateTime, server_default=utc_now()
    )
    origin: Mapped[str | None] = mapped_column("origem", String(150))
    destination: Mapped[str | None] = mapped_column("destino", String(150))
    process: Mapped[str | None] = mapped_column("processo", String(250))
    external_key: Mapped[str | None] = mapped_column("chave_externa", String(100))
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column("proxima_tentativa", UtcDateTime)
    attempt: Mapped[int | None] = mapped_column("tentativa", Integer, server_default=text("1"))
    status: Mapped[str | None] = mapped_column(
        "status", String(100), server_default=Status.PENDING.value
    )
    requeued: Mapped[bool | None] = mapped_column("reenfileirado", Boolean, server_default=false())
    retries_exhausted: Mapped[bool | None] = mapped_column(
        "estouro_tentativas", Boolean, server_default=false()
    )
    message: Mapped[str | None] = mapped_column("mensagem", String(MESSAGE_MAX_LENGTH))
    previous_id: Mapped[int | None] = mapped_column("id_anterior", BigInteger)
    previous_run_at: Mapped[dt.datetime | None] = mapped_column("data_hora_anterior", UtcDateTime)
    previous_status: Mapped[str | None] = mapped_column("status_anterior", String(100))
    previous_message: Mapped[str | None] = mapped_column(
        "mensagem_anterior", String(MESSAGE_MAX_LENGTH)
    )
    payload_text: Mapped[str | None] = mapped_column("payload", PayloadText())
    tenant: Mapped[int | None] = mapped_column("tenant", BigInteger)
    company_group: Mapped[str | None] = mapped_column("grupo_empresarial", String(40))
    payload_hash: Mapped[bytes | None] = mapped_column("payload_hash", PayloadHash())
    pub_sub: Mapped[bool] = mapped_column(
        "pub_sub", Boolean, nullable=False, server_default=false(), default=False
    )
    publication_id: Mapped[int | None] = mapped_column("publication_id", BigInteger)
    subscriber_id: Mapped[str | None] = mapped_column("subscriber_id", String(100))
    dead: Mapped[bool] = mapped_column(
        "dead", Boolean, nullable=False, server_default=false(), default=False
    )
    live_id: Mapped[int | None] = mapped_column("live_id", BigInteger)
    priority: Mapped[int | None] = mapped_column(
        "prioridade", Integer, server_default=text(str(DEFAULT_PRIORITY))
    )
    # Ours, not the seed's: the claim of a 'processando' task. The worker
    # that claimed it (worker_id) renews lease_expires_at while its handler
    # runs; the rescue takes the task only once the lease has expired (or,
    # where the database has them, once the worker's per-task lock died),
    # and completion is guarded by (status, worker_id). See docs/lifecycle.md.
    worker_id: Mapped[str | None] = mapped_column("worker_id", String(WORKER_ID_MAX_LENGTH))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column("lease_expires_at", UtcDateTime)
    # Ours too: the database's clock when the attempt was claimed and when it
    # ended (sucesso, falha, or rescued as falha_processando). A task handed
    # back unrun loses its started_at.
    started_at: Mapped[dt.datetime | None] = mapped_column("started_at", UtcDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column("finished_at", UtcDateTime)
    # Ours: a failed attempt's traceback (its frames and its one-line error,
    # masked as the logs are, at most TRACEBACK_MAX_LENGTH characters);
    # NULL on every other attempt, and on a rescued one (its worker died).
    error_traceback: Mapped[str | None] = mapped_column("error_traceback", Text)
    # Ours: the W3C trace context (JSON: traceparent, tracestate) of the
    # span that enqueued the task, when sqla_queue.ops.tracing is instrumented;
    # the worker's span for the task is its child. Retries keep it.
    trace_context: Mapped[str | None] = mapped_column("trace_context", Text)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        as_model_fields(cls, QueueMixin)

    @hybrid_property
    def payload(self) -> Any:
        """The task's payload as a Python value (the decoded JSON).

        Assigning keeps the value until flush, when it is serialised once
        and hashed (see ``sqla_queue.install`` and ``docs/payload.md``)."""
        pending = self.__dict__.get("payload_hash")
        if type(pending) is PendingHash and pending.has_payload:
            return pending.payload
        return decode_payload(self.payload_text)

    @payload.inplace.setter
    def _payload_setter(self, value: Any) -> None:
        # kept in payload_hash until the flush (PendingHash says why); the
        # assignment marks the row dirty, so the flush hook sees it
        self.payload_hash = PendingHash(value)  # type: ignore[assignment]

    @payload.inplace.expression
    @classmethod
    def _payload_expression(cls) -> ColumnElement[str | None]:
        return cls.payload_text  # type: ignore[return-value]

    if hasattr(hybrid_property, "bulk_dml"):  # SQLAlchemy 2.1

        @payload.inplace.bulk_dml
        @classmethod
        def _payload_bulk_dml(cls, mapping: MutableMapping[str, Any], value: Any) -> None:
            # an ORM bulk INSERT (session.execute(insert(Task), [{...}])) is
            # prepared by sqla-queue's do_orm_execute hook, which marks each
            # row; a row without the mark came another way (bulk_insert_mappings)
            if not mapping.get(PREPARED_ROW):
                raise UnpreparedTaskError()

    def after(self: _Task, *parents: QueueMixin | Steps) -> _Task:
        """Run this task once every one of ``parents`` (tasks, or chains
        and groups: their last tasks) has succeeded; its
        ``parent_results()`` reads theirs in this order, after those of a
        chain or group it is in. Returns the task, so ``d =
        Task(...).after(b, c)``. A workflow that contains the task enqueues
        its parents too (docs/workflows.md, "Arbitrary DAGs")."""
        add_parents(self, parents, QueueMixin)
        return self

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id!r} process={self.process!r} "
            f"status={self.status!r} attempt={self.attempt!r}>"
        )


PREPARED_ROW = "_sqla_queue_prepared_row"
"""Key that sqla-queue adds to each parameter set of an ORM INSERT it prepared."""


@event.listens_for(QueueMixin, "init", propagate=True)
def _mark_unprepared(target: QueueMixin, args: Any, kwargs: Any) -> None:
    # before the constructor's arguments are set: a payload_hash given there
    # replaces the mark. Without a payload, a new row still needs the flush
    # hook (status, first run time, hash of a payload_text), and the mark
    # makes a path that skips it fail (see PendingHash).
    target.__dict__["payload_hash"] = UNHASHED


def pending_payload(task: QueueMixin) -> PendingHash | None:
    """The placeholder in ``task.payload_hash`` before its flush, if any."""
    value = task.__dict__.get("payload_hash")
    return value if type(value) is PendingHash else None


COLUMN_NAMES: dict[str, str] = {
    name: column.name  # type: ignore[attr-defined]
    for name, column in vars(QueueMixin).items()
    if hasattr(column, "column") and hasattr(column.column, "name")
}
"""English attribute -> seed column name."""


def channel_of(cls: type[QueueMixin], table: Table) -> str:
    validate_identifier(table.name, "table name")  # the default channel: report it as a table
    return validate_identifier(cls.__queue_channel__ or table.name, "channel name")


# ddl_if() takes a tuple of names at run time; its annotation says str
_PARTIAL_INDEX_DIALECTS: Any = ("postgresql", "sqlite")
_MYSQL_DIALECTS: Any = ("mysql", "mariadb", "singlestoredb")
_POSTGRESQL: Any = ("postgresql",)
_NOT_POSTGRESQL: Any = ("sqlite", "mysql", "mariadb", "singlestoredb")


QUEUE_INDEX_INFO = "sqla_queue_index"
"""``Index.info`` key of the indexes sqla-queue adds to a queue table; its
value says how the name was made (``suffix``: ``ix_<table>_<suffix>``) and
on which dialects the index is made (``dialects``, None: every one). The
alembic operations read it (docs/migrations.md)."""


def add_queue_schema(
    table: Table,
    channel: str,
    *,
    equivalence_index: bool = True,
    fair_by: tuple[str, ...] = (),
) -> None:
    """Indexes and, on PostgreSQL, the NOTIFY trigger of one queue table.
    ``equivalence_index``: whether to make ``ix_<table>_equivalente``;
    ``fair_by``: the columns of ``ix_<table>_justo_<column>``."""
    if table.info.get("sqla_queue"):
        return
    validate_identifier(table.name, "table name")
    if table.schema is not None:
        validate_identifier(table.schema, "schema name")
    table.info["sqla_queue"] = {"channel": channel}
    # Never give an id twice. SQLite's default rowid is the largest id in
    # the table plus one, so once the purge deleted the newest rows a new
    # task would get a purged task's id, and with it its chain_id and
    # webhook-id, which handlers and receivers deduplicate on. AUTOINCREMENT
    # keeps the largest id ever given (in sqlite_sequence). Set here, not in
    # the mixin's __table_args__, which a model's own would replace.
    # PostgreSQL's sequence and InnoDB's counter (kept across restarts since
    # MariaDB 10.2.4) never go back. docs/migrations.md: an older SQLite table.
    table.dialect_kwargs["sqlite_autoincrement"] = True
    c = table.c
    name = table.name

    def index(suffix: str, *expressions: Any, dialects: Any = None, **kw: Any) -> None:
        made = Index(
            derived_identifier(name, suffix, "ix_"),
            *expressions,
            info={QUEUE_INDEX_INFO: {"suffix": suffix, "dialects": dialects}},
            **kw,
        )
        if dialects is not None:
            made.ddl_if(dialect=dialects)

    pending = c.status == Status.PENDING.value
    # Ready tasks in claim order. Partial where the dialect can: finished rows
    # (the seed keeps every attempt) never slow down the claim.
    index(
        "pendente",
        c.prioridade.desc(),
        c.data_hora,
        c.id,
        postgresql_where=pending,
        sqlite_where=pending,
        dialects=_PARTIAL_INDEX_DIALECTS,
    )
    # Routing (a worker's ``processes``, a pub/sub worker's subscriber ids):
    # ready rows of some processes in claim order, and ready copies by
    # subscriber. Partial where the dialect can, so finished rows, and plain
    # tasks for the second, cost nothing (docs/pubsub.md has the measured cost).
    index(
        "pendente_processo",
        c.processo,
        c.prioridade.desc(),
        c.data_hora,
        c.id,
        postgresql_where=pending,
        sqlite_where=pending,
        dialects=_PARTIAL_INDEX_DIALECTS,
    )
    # Per-key fairness (fairness.py): the keys with ready rows are found by
    # skipping through the index from key to key, and each key's ready rows
    # are claimed in claim order from it
    for fair in fair_by:
        key = c[fair]
        index(
            f"justo_{fair}",
            key,
            c.prioridade.desc(),
            c.data_hora,
            c.id,
            postgresql_where=pending,
            sqlite_where=pending,
            dialects=_PARTIAL_INDEX_DIALECTS,
        )
        index(
            f"status_justo_{fair}",
            c.status,
            key,
            c.prioridade.desc(),
            c.data_hora,
            dialects=_MYSQL_DIALECTS,
        )
    pending_copy = and_(pending, c.subscriber_id.is_not(None))
    index(
        "pendente_assinante",
        c.subscriber_id,
        postgresql_where=pending_copy,
        sqlite_where=pending_copy,
        dialects=_PARTIAL_INDEX_DIALECTS,
    )
    index(
        "status_processo",
        c.status,
        c.processo,
        c.prioridade.desc(),
        c.data_hora,
        dialects=_MYSQL_DIALECTS,
    )
    index("status_assinante", c.status, c.subscriber_id, dialects=_MYSQL_DIALECTS)
    scheduled = c.status == Status.SCHEDULED.value
    index(
        "agendada",
        c.data_hora,
        postgresql_where=scheduled,
        sqlite_where=scheduled,
        dialects=_PARTIAL_INDEX_DIALECTS,
    )
    processing = c.status == Status.PROCESSING.value
    index(
        "processando",
        c.id,
        postgresql_where=processing,
        sqlite_where=processing,
        dialects=_PARTIAL_INDEX_DIALECTS,
    )
    index(
        "status_prioridade",
        c.status,
        c.prioridade.desc(),
        c.data_hora,
        dialects=_MYSQL_DIALECTS,
    )
    index("status_data_hora", c.status, c.data_hora, dialects=_MYSQL_DIALECTS)
    # A task without payload has no hash and is never "equivalent": where the
    # dialect can, such rows stay out of the index (one index write less).
    # Nor are running tasks: the claim and the completion each write a new
    # row version into every index whose predicate it meets (the status
    # change is never a HOT update), and this index holds every finished
    # attempt by a random key, so each such write lands on a random page of
    # a large index. Leaving 'processando' out halves those writes; a
    # look-up for running tasks reads them through ix_processando instead
    # (see equivalence_criteria).
    # On PostgreSQL a hash index on payload_hash alone: its entries are a
    # 4-byte hash code and a row pointer (a B-tree's hold the 64-byte hex
    # digest, the external key and the status, on pages split half empty
    # by random keys), a fraction of the bytes per finished task
    # without vacuum; the look-up's other conditions are checked on the few
    # rows with the same hash. Elsewhere the B-tree (MariaDB and SQLite
    # have no hash index on disk). docs/benchmarks.md, (g).
    # A queue that never looks for equivalent tasks (list_equivalent_task,
    # the Spark writer's dedupe) can go without it: __queue_equivalence_index__
    # = False on the model.
    if equivalence_index:
        equivalent = equivalence_predicate(c)
        index(
            "equivalente",
            c.payload_hash,
            postgresql_using="hash",
            postgresql_where=equivalent,
            dialects=_POSTGRESQL,
        )
        index(
            "equivalente",
            c.chave_externa,
            c.payload_hash,
            c.status,
            postgresql_where=equivalent,  # the alembic operation's WHERE, made on SQLite
            sqlite_where=equivalent,
            dialects=_NOT_POSTGRESQL,
        )
    # A chain's rows: its retries (id_inicial) and its dead-letter run
    # (live_id). The purge reads whole chains through them. Partial where the
    # dialect can: a first attempt, most rows, has neither and costs nothing.
    for suffix, column in (("inicial", c.id_inicial), ("live", c.live_id)):
        index(
            suffix,
            column,
            postgresql_where=column.is_not(None),
            sqlite_where=column.is_not(None),
        )
    # A publication's copies, for a task's timeline (sqla-queue status
    # --task): partial, so only copies pay for it. PostgreSQL only: MariaDB
    # and SQLite read them by a primary-key range (ids after the
    # publication's), which PostgreSQL's planner, on a table never analysed,
    # takes for most of the table.
    index(
        "publicacao",
        c.publication_id,
        postgresql_where=c.publication_id.is_not(None),
        dialects=_POSTGRESQL,
    )
    # Time-range queries only (dashboards, retention): on PostgreSQL a BRIN
    # index, a few pages that an insert rarely touches, since data_hora grows
    # with the insertion order.
    index("data_hora", c.data_hora, postgresql_using="brin")
    _add_notify_trigger(table, channel)
    workflow_tables(table)


# ---------------------------------------------------------------- workflows
#: what a workflow does when one of its steps goes to the dead letter: its
#: waiting descendants are cancelled, or its children run as if it had
#: succeeded (with None for its result), or they are cancelled and the
#: workflow's compensation step runs
ON_FAILURE = ("stop", "continue", "compensate")
#: a step's result (its handler's return value, as JSON) holds at most this
#: many bytes (what a TEXT column holds on MySQL); a larger one fails the step
RESULT_MAX_BYTES = 65_535
#: ``<table>_wf_steps.state`` of a step the stop policy or an operator cancelled
STEP_CANCELLED = "cancelled"
#: ``<table>_wf_steps.state`` of a step that went to the dead letter
STEP_DEAD = "dead_letter"
#: ``<table>_wf_steps.state`` of a workflow's compensation step: it waits for
#: no parent, and runs when the workflow fails (``on_failure="compensate"``)
STEP_COMPENSATION = "compensation"
#: a child with more parents than this waits on barrier gates (one per block
#: of parents) rather than on one gate all of its parents decrement
GATE_FANIN = 64


@dataclass(frozen=True)
class WorkflowTables:
    """The three tables beside a queue table that hold its workflows
    (docs/workflows.md): ``steps`` (one row per step: its workflow, its
    workflow's failure policy, its result), ``edges`` (child, parent, the
    parent's position among the child's parents, the gate of the child it
    opens, done) and ``gates`` (how many parents a child, or a block of its
    parents, still waits for; owner ``-W`` is workflow W's end)."""

    steps: Table
    edges: Table
    gates: Table


COMPANION_INDEX_INFO = "sqla_queue_companion_index"
"""``Index.info`` key of an index of a table beside a queue table (the
workflows'): its name is ``ix_<that table>_<the value>``, which
``rename_queue_table`` renames with the table."""


def _companion_index(table_name: str, suffix: str, *columns: str) -> Index:
    return Index(
        derived_identifier(table_name, suffix, "ix_"),
        *columns,
        info={COMPANION_INDEX_INFO: suffix},
    )


def workflow_tables(table: Table) -> WorkflowTables:
    """``<table>_wf_steps``, ``<table>_wf_edges`` and ``<table>_wf_gates`` in
    the queue table's MetaData (made and dropped with it by ``create_all``,
    printed by ``sqla-queue ddl``, added by autogenerate). A step is its
    task's chain: ``step_id`` is the id of the chain's first row, which its
    retries carry as ``id_inicial``. No foreign key: the purge deletes
    finished chains without knowing of workflows."""
    metadata = table.metadata
    suffixes = ("wf_steps", "wf_edges", "wf_gates")
    names = [derived_identifier(table.name, suffix, "") for suffix in suffixes]
    for name in names:
        validate_identifier(name, "workflow table name")
    keys = [f"{table.schema}.{name}" if table.schema else name for name in names]
    if all(key in metadata.tables for key in keys):
        return WorkflowTables(*(metadata.tables[key] for key in keys))
    big = BigInteger().with_variant(Integer, "sqlite")
    info = {"sqla_queue_workflow_of": table.name}
    steps = Table(
        names[0],
        metadata,
        Column("step_id", big, primary_key=True, autoincrement=False),
        Column("workflow_id", big, nullable=False),
        Column("on_failure", String(16), nullable=False),
        Column("result", Text),
        Column("state", String(16)),
        _companion_index(names[0], "workflow", "workflow_id"),
        schema=table.schema,
        info=info,
    )
    edges = Table(
        names[1],
        metadata,
        Column("child_id", big, primary_key=True, autoincrement=False),
        Column("parent_id", big, primary_key=True, autoincrement=False),
        Column("position", Integer, nullable=False),
        # the gate of the child this edge opens: 0 its own, else a barrier
        Column("slot", Integer, nullable=False, default=0, server_default="0"),
        Column("done", Boolean, nullable=False, default=False, server_default=false()),
        _companion_index(names[1], "parent", "parent_id"),
        schema=table.schema,
        info=info,
    )
    gates = Table(
        names[2],
        metadata,
        # a step's id, or -W for workflow W's end (its steps without children)
        Column("owner_id", big, primary_key=True, autoincrement=False),
        # 0: the owner's own gate; 1 and up: barriers that open slot 0
        Column("slot", Integer, primary_key=True, autoincrement=False),
        Column("waiting", Integer, nullable=False),
        # the workflow's outcome, on its end's gate 0 (succeeded, failed, cancelled)
        Column("outcome", String(16)),
        schema=table.schema,
        info=info,
    )
    return WorkflowTables(steps, edges, gates)


_STATUS_VALUES = frozenset(status.value for status in Status)


def equivalence_predicate(c: Any) -> ColumnElement[bool]:
    """The rows of ``ix_<table>_equivalente`` where the dialect has partial
    indexes: those with a payload, outside ``processando``."""
    return and_(c.payload_hash.is_not(None), c.status != _PROCESSING_LITERAL)


def equivalence_criteria(
    c: Any, statuses: Iterable[str] | None = None
) -> list[ColumnElement[bool]]:
    """One criterion per index that serves a look-up of equivalent tasks in
    ``statuses`` (None: every status; a payload hash or external key
    condition goes beside it): the statuses other than ``processando``
    through ``ix_equivalente``, whose predicate the literal ``status <>
    'processando'`` lets the planner match whatever the bound values;
    ``processando`` through ``ix_processando``. OR them, or run one query
    per criterion."""
    if statuses is None:
        return [equivalence_predicate(c), c.status == _PROCESSING_LITERAL]
    wanted = list(dict.fromkeys(statuses))
    others = [status for status in wanted if status != Status.PROCESSING.value]
    criteria: list[ColumnElement[bool]] = []
    if others:
        known = [status for status in others if status in _STATUS_VALUES]
        unknown = [status for status in others if status not in _STATUS_VALUES]
        # the known values inline (a plan that fits any parameters), others bound
        matched = [status_is(c.status, *known)] if known else []
        if unknown:
            matched.append(c.status.in_(unknown))
        criteria.append(and_(equivalence_predicate(c), or_(*matched)))
    if len(others) < len(wanted):
        criteria.append(c.status == _PROCESSING_LITERAL)
    return criteria


#: A queue table's storage parameters on PostgreSQL. Every task's row is
#: updated two or three times and later deleted, so the defaults made for
#: ordinary tables let dead tuples pile up: where autovacuum runs, it runs
#: for this table after 1,000 dead tuples plus 1 % of the table (the default
#: waits for 20 %: a million dead rows beside five million finished ones),
#: at full speed, and analyses it as often. fillfactor stays at 100 (set,
#: so that the statement also resets a table made with this library's
#: earlier 90): the status changes are never HOT updates (the partial
#: indexes depend on status), and in a long-horizon run without vacuum
#: the heap stayed smaller at 100 than at 90 for the same tasks, at the
#: same latency (docs/benchmarks.md, (g)). Page pruning still frees room
#: for the heartbeat's HOT lease renewals.
STORAGE_PARAMETERS: tuple[tuple[str, str], ...] = (
    ("fillfactor", "100"),
    ("autovacuum_vacuum_threshold", "1000"),
    ("autovacuum_vacuum_scale_factor", "0.01"),
    ("autovacuum_vacuum_insert_scale_factor", "0.05"),
    ("autovacuum_analyze_threshold", "1000"),
    ("autovacuum_analyze_scale_factor", "0.02"),
    ("autovacuum_vacuum_cost_delay", "0"),
)


@dataclass(frozen=True)
class NotifyTriggerDDL:
    """The PostgreSQL statements of a queue table's NOTIFY trigger.

    One source for ``metadata.create_all()``, ``sqla-queue ddl`` and the
    alembic operations, so the three make the same function and trigger."""

    trigger: str
    create_function: str
    create_trigger: str
    #: the table's storage parameters (STORAGE_PARAMETERS), set with the
    #: trigger wherever a queue table is made on PostgreSQL
    set_storage: str
    drop_trigger: str
    drop_function: str


def notify_trigger_ddl(table_name: str, schema: str | None, channel: str) -> NotifyTriggerDDL:
    """The trigger of ``schema.table_name`` that NOTIFYs ``channel``."""
    validate_identifier(table_name, "table name")
    if schema is not None:
        validate_identifier(schema, "schema name")
    validate_identifier(channel, "channel name")
    # One NOTIFY per INSERT statement (not per row): a bulk insert wakes the
    # workers once. Every insert notifies, scheduled ones too, so idle workers
    # re-arm their timers for the new due time.
    qualified = f'"{schema}".' if schema else ""
    trigger = derived_identifier(table_name, "sqlaq_notify")
    function = f'{qualified}"{trigger}"'
    return NotifyTriggerDDL(
        trigger=trigger,
        create_function=(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$"
        ),
        create_trigger=(
            f'CREATE TRIGGER "{trigger}" AFTER INSERT ON {qualified}"{table_name}" '
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        ),
        set_storage=(
            f'ALTER TABLE {qualified}"{table_name}" SET ('
            + ", ".join(f"{name} = {value}" for name, value in STORAGE_PARAMETERS)
            + ")"
        ),
        drop_trigger=f'DROP TRIGGER IF EXISTS "{trigger}" ON {qualified}"{table_name}"',
        drop_function=f"DROP FUNCTION IF EXISTS {function}()",
    )


def _add_notify_trigger(table: Table, channel: str) -> None:
    ddl = notify_trigger_ddl(table.name, table.schema, channel)
    for when, statement in (
        ("after_create", ddl.create_function),
        ("after_create", ddl.create_trigger),
        ("after_create", ddl.set_storage),
        ("after_drop", ddl.drop_function),
    ):
        ddl_element = DDL(statement)  # type: ignore[no-untyped-call]
        event.listen(table, when, ddl_element.execute_if(dialect="postgresql"))


def fair_columns(cls: type, table: Table) -> tuple[str, ...]:
    """``cls.__queue_fair_by__`` checked: a tuple of the table's column names."""
    declared = getattr(cls, "__queue_fair_by__", ())
    if isinstance(declared, str) or not isinstance(declared, tuple):
        raise ConfigurationError(
            f"{cls.__name__}.__queue_fair_by__ must be a tuple of column names, not {declared!r}"
        )
    for column in declared:
        if not isinstance(column, str) or column not in table.c:
            raise ConfigurationError(
                f"{cls.__name__}.__queue_fair_by__: {column!r} is not a column of {table.name}"
            )
    return declared


@event.listens_for(QueueMixin, "after_mapper_constructed", propagate=True)
def _configure_queue_table(mapper: Mapper[Any], cls: type[QueueMixin]) -> None:
    table = mapper.local_table
    if isinstance(table, Table) and mapper.inherits is None:
        add_queue_schema(
            table,
            channel_of(cls, table),
            equivalence_index=bool(getattr(cls, "__queue_equivalence_index__", True)),
            fair_by=fair_columns(cls, table),
        )
    if mapper.inherits is None and "eager_defaults" not in _mapper_args(cls):
        # The INSERT returns the id only; the server defaults (data_hora,
        # tentativa, prioridade...) load on first access. Fetching them with
        # RETURNING slowed every ORM enqueue, for values a task is rarely
        # read back for before its commit expires them. Set here, not as the
        # mixin's __mapper_args__, which subclasses of the model would inherit.
        mapper.eager_defaults = False


def _mapper_args(cls: type) -> Mapping[str, Any]:
    args = getattr(cls, "__mapper_args__", None)
    return args if isinstance(args, Mapping) else {}


# ---------------------------------------------------------------- SQLModel
def _is_sqlmodel(cls: type) -> bool:
    return any(base.__module__.split(".")[0] == "sqlmodel" for base in cls.__mro__[1:])


def as_model_fields(cls: Any, mixin: type) -> None:
    """``mixin``'s columns as fields of ``cls`` when ``cls`` is a SQLModel
    model (``class Task(QueueMixin, SQLModel, table=True)``).

    SQLModel builds a table model's columns from its pydantic fields, and
    pydantic can neither read ``Mapped[...]`` nor set an attribute that is
    not a field; so each column of the mixin becomes, on the subclass, a
    field of the annotation's Python type whose ``sa_column`` is a fresh
    copy of the mixin's column (name, type, defaults), and the constructor
    takes the mixin's other settable attributes (``payload``) as before.
    Called from ``__init_subclass__``: before pydantic reads the fields."""
    if not _is_sqlmodel(cls) or "__sqla_queue_fields__" in cls.__dict__:
        return
    from sqlmodel import Field  # the user's: present whenever cls is a SQLModel

    # pydantic warns of a field named like an attribute of a parent: here
    # the field is that attribute, made a field on purpose
    warnings.filterwarnings(
        "ignore",
        message=rf'Field name ".*" in ".*" shadows an attribute in parent "{mixin.__name__}"',
        category=UserWarning,
    )

    hints = _mixin_hints(mixin)
    own = inspect.get_annotations(cls)
    for name, attribute in vars(mixin).items():
        column = getattr(attribute, "column", None)
        if not isinstance(column, Column) or name in own:
            continue
        python_type = hints[name]
        default = getattr(column.default, "arg", None)
        # Optional[...], not "| None": Python 3.10's typing.Any has no "|"
        optional = Optional[python_type]  # type: ignore[valid-type]  # noqa: UP045
        cls.__annotations__[name] = optional if default is None else python_type
        setattr(cls, name, Field(default=default, sa_column=_copy_column(column)))
    cls.__sqla_queue_fields__ = True  # type: ignore[attr-defined]
    _take_keywords(cls, mixin)


def _mixin_hints(mixin: type) -> dict[str, Any]:
    """The Python type inside each ``Mapped[...]`` annotation of ``mixin``."""
    import typing

    hints = typing.get_type_hints(mixin, include_extras=False)
    return {
        name: typing.get_args(hint)[0]
        for name, hint in hints.items()
        if typing.get_origin(hint) is Mapped
    }


def _copy_column(column: Column[Any]) -> Column[Any]:
    server_default = column.server_default
    return Column(
        column.name,
        column.type,
        primary_key=column.primary_key,
        nullable=column.nullable,
        autoincrement=column.autoincrement,
        server_default=getattr(server_default, "arg", None),
        default=getattr(column.default, "arg", None),
    )


def _take_keywords(cls: Any, mixin: type) -> None:
    """``mixin``'s settable attributes that are not columns (``payload``):
    taken by the constructor, which SQLModel's own drops, and set through
    their setter, which pydantic's ``__setattr__`` does not call."""
    setters = {
        name: attribute.fset
        for name, attribute in vars(mixin).items()
        if isinstance(attribute, hybrid_property) and attribute.fset is not None
    }
    if not setters:
        return
    init, setattr_ = cls.__init__, cls.__setattr__

    def __init__(self: Any, **values: Any) -> None:
        later = {name: values.pop(name) for name in setters.keys() & values.keys()}
        init(self, **values)
        for name, value in later.items():
            setters[name](self, value)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if name in setters:
            setters[name](self, value)
        else:
            setattr_(self, name, value)

    cls.__init__ = __init__
    cls.__setattr__ = __setattr__
