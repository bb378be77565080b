"""``TaskRecord``: the read-only view of a claimed task given to handlers.

Attributes are the model's English names; ``record["tentativa"]`` reads a
column by its seed name, so code ported from nsj-queue-lib's ``tarefa`` dict
keeps working.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from ..common.payload import decode_payload
from .mixins import COLUMN_NAMES, OWN_COLUMNS

#: English attribute -> seed column (the seed's ``tarefa`` dict keys)
SEED_COLUMNS = {name: column for name, column in COLUMN_NAMES.items() if column not in OWN_COLUMNS}
_ATTRIBUTES = {column: attribute for attribute, column in SEED_COLUMNS.items()}


class SeedColumns(Mapping[str, Any]):
    """A read-only record that also reads as the seed's dict: by column name
    (``record["tentativa"]``). Subclasses name their columns' attributes."""

    __slots__ = ()
    #: seed column name -> attribute name
    seed_attributes: ClassVar[Mapping[str, str]]

    def __getitem__(self, column: str) -> Any:
        try:
            return getattr(self, self.seed_attributes[column])
        except KeyError:
            raise KeyError(column) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.seed_attributes)

    def __len__(self) -> int:
        return len(self.seed_attributes)


@dataclass(frozen=True, slots=True)
class TaskRecord(SeedColumns):
    """One attempt of a task, as claimed (``status`` is ``processando``)."""

    id: int
    initial_id: int | None = None
    first_run_at: dt.datetime | None = None
    run_at: dt.datetime | None = None
    origin: str | None = None
    destination: str | None = None
    process: str | None = None
    external_key: str | None = None
    next_attempt_at: dt.datetime | None = None
    attempt: int = 1
    status: str | None = None
    requeued: bool | None = None
    retries_exhausted: bool | None = None
    message: str | None = None
    previous_id: int | None = None
    previous_run_at: dt.datetime | None = None
    previous_status: str | None = None
    previous_message: str | None = None
    payload_text: str | None = None
    tenant: int | None = None
    company_group: str | None = None
    payload_hash: bytes | None = None
    pub_sub: bool = False
    publication_id: int | None = None
    subscriber_id: str | None = None
    dead: bool = False
    live_id: int | None = None
    priority: int | None = None
    worker_id: str | None = None
    lease_expires_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    error_traceback: str | None = None
    trace_context: str | None = None
    #: columns of the user's model beyond sqla-queue's, by column name:
    #: carried to the task's retry and dead-letter rows
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    _decoded: list[Any] = field(default_factory=list, repr=False, compare=False)
    #: the gates a workflow step opens, (child, slot) each (``-W``: its
    #: workflow's end), read when the task was claimed (the manager's):
    #: their count-down commits with this task's ``sucesso``
    _children: tuple[tuple[int, int], ...] = field(default=(), repr=False, compare=False)
    #: the handler's return value as JSON, kept for the children to read
    _result: str | None = field(default=None, repr=False, compare=False)
    #: reads the parents' results on the handler's transaction (the manager
    #: sets it before the handler runs, where the queue has workflow tables)
    _parents: Callable[[], list[Any]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskRecord:
        """Build from a row keyed by seed column names."""
        return cls.from_rows(list(row.keys()), [tuple(row.values())])[0]

    @classmethod
    def from_rows(cls, keys: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[TaskRecord]:
        """Build from result rows whose columns are named by ``keys``."""
        where = {key: i for i, key in enumerate(keys)}
        # a table made by nsj-queue-lib may lack sqla-queue's columns: None
        index = [where.get(column) for column in _COLUMN_ORDER]
        extra = [
            (key, i)
            for key, i in where.items()
            if key not in _KNOWN and not key.startswith("sqlaq_")
        ]
        records = []
        fix = object.__setattr__
        for row in rows:
            values: list[Any] = [None if i is None else row[i] for i in index]
            record = cls(*values)
            if extra:
                fix(record, "extra", {key: row[i] for key, i in extra})
            # normalise what drivers return differently (0/1 booleans, memoryview)
            fix(record, "attempt", record.attempt or 1)
            fix(record, "pub_sub", bool(record.pub_sub))
            fix(record, "dead", bool(record.dead))
            if record.payload_hash is not None and not isinstance(record.payload_hash, bytes):
                fix(record, "payload_hash", bytes(record.payload_hash))
            records.append(record)
        return records

    @property
    def payload(self) -> Any:
        """The payload decoded from JSON (the text itself if it is not JSON)."""
        if not self._decoded:
            self._decoded.append(decode_payload(self.payload_text))
        return self._decoded[0]

    @property
    def chain_id(self) -> int:
        """The id of the first attempt of this task."""
        return self.initial_id or self.id

    @property
    def step_id(self) -> int | None:
        """The workflow step this attempt runs, if it is one: its chain, or
        for a chain requeued from the dead letter, the chain it revives
        (``live_id``). None for a dead-letter run, which releases nothing."""
        if self.dead:
            return None
        return self.live_id if self.live_id is not None else self.chain_id

    def parent_results(self) -> list[Any]:
        """The results of this workflow step's parents (their handlers'
        return values, decoded from JSON), in the order the parents were
        given: one for a step of a chain, the group's in its order for a
        group's callback; None for a parent that failed under the
        ``continue`` policy. Empty for a task that is not a step. Read in
        the handler's transaction (docs/workflows.md)."""
        reader = self._parents
        return [] if reader is None else reader()

    async def parent_results_async(self) -> list[Any]:
        """:meth:`parent_results` for an async handler: ``await
        task.parent_results_async()``. The read is a statement, which an
        async driver runs only inside SQLAlchemy's greenlet (as
        ``AsyncSession.run_sync`` does); a plain call there raises
        ``MissingGreenlet``."""
        from sqlalchemy.util import greenlet_spawn

        return await greenlet_spawn(self.parent_results)

    def as_dict(self) -> dict[str, Any]:
        """The seed's ``tarefa`` dict: seed column names to values."""
        return {column: self[column] for column in _ATTRIBUTES}


TaskRecord.seed_attributes = _ATTRIBUTES


_COLUMN_ORDER = [COLUMN_NAMES[f.name] for f in fields(TaskRecord) if f.name in COLUMN_NAMES]
_KNOWN = frozenset(COLUMN_NAMES.values())
_PRIVATE = {"_decoded", "extra", "_children", "_result", "_parents"}
assert set(COLUMN_NAMES) == {f.name for f in fields(TaskRecord)} - _PRIVATE
