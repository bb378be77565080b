"""The enqueue job's executor side: one partition, one transaction.

Spark calls :func:`write_partition` once per partition, in a Python worker
of an executor, with the partition's Arrow batches (``mapInArrow``). It opens
its own connection and writes every row of the partition in one
transaction, a batch at a time, through the adapter's ``task_insert_many``:
COPY on PostgreSQL with psycopg, batched INSERTs on MariaDB and SQLite. Each
row is made by the same function as ``QueueClient.insert_tasks`` makes its
rows (``_task_row``: the payload's text and hash, the status from the run
time, the default priority), so a task enqueued from Spark is the task the
ORM would have written. The workers are woken once, at the commit (a
PostgreSQL NOTIFY; the other databases' workers poll).

A bad row (a value that is not JSON, a null key where one is required, a key
too long for its column) rolls the whole partition back and fails the job
with a message that names the column and shows the row.

Deduplication (``dedupe=True``) skips a row whose key is already in the
table, in any status, or earlier in the same job. The key is (process,
tenant, external key) when an external key column is given, else (process,
tenant, payload hash) among tasks without an external key; either way
among tasks with a payload, which every row must then have (the lookup
uses the equivalence index, which holds only those). To hold when two
partitions, two attempts of one Spark task, or two jobs write the same key
at once, each partition first takes a lock per key bucket it holds (the
driver sends all rows of a bucket to one partition), in ascending order, so
concurrent writers of a bucket take turns and none deadlocks:
``pg_advisory_xact_lock`` on PostgreSQL (freed by the commit), ``GET_LOCK``
on MariaDB (freed after it; the transaction runs at READ COMMITTED so that
the existence check sees what the previous holder committed), SQLite's write
lock (``BEGIN IMMEDIATE``) otherwise.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, create_engine
from sqlalchemy.pool import NullPool

from ..adapters import Adapter, adapter_for
from ..client.queue import _task_row, resolve_table
from ..common.exceptions import InvalidTaskError, PayloadError, SqlaQueueError
from ..common.identifiers import lock_namespace
from ..common.payload import hash_payload_texts, json_key, serialize_payload
from ..common.redaction import describe_error, redact
from ..common.types import utcnow
from ..schema.mixins import DEFAULT_PRIORITY, MESSAGE_MAX_LENGTH

__all__ = ["BadRowError", "WriteSpec", "write_partition"]

#: key buckets for the dedupe locks: a partition holds a few, two jobs wait
#: for each other only on the buckets they share
LOCK_BUCKETS = 256
LOCK_WAIT_SECONDS = 600
EXISTING_KEYS_PER_QUERY = 2000
EXTERNAL_KEY_MAX_LENGTH = 100  # chave_externa varchar(100)
ROW_SHOWN_MAX_CHARS = 300
#: what the driver looks for in a failed job's text to show the cause alone
ERROR_MARK = "[sqla-queue] "

# column names of the DataFrame the driver hands to mapInArrow
KEY = "__sqlaq_key"
TENANT = "__sqlaq_tenant"
PRIORITY = "__sqlaq_priority"
RUN_AT = "__sqlaq_run_at"
BUCKET = "__sqlaq_bucket"
RESERVED = (KEY, TENANT, PRIORITY, RUN_AT, BUCKET)
#: the schema of the rows write_partition yields (one per partition)
RESULT_SCHEMA = "partition int, rows long, enqueued long, duplicates long, error string"


class BadRowError(SqlaQueueError):
    """A row of the DataFrame cannot be a task."""


@dataclass(frozen=True)
class WriteSpec:
    """What every partition needs, pickled by Spark to the executors."""

    url: str
    table: str  # schema-qualified name
    channel: str
    process: str
    #: the payload: a dict of these columns, or (single) the one column's value
    payload_columns: tuple[str, ...]
    single_payload: bool
    #: the user's column names, for error messages
    key_column: str | None
    tenant_column: str | None
    priority_column: str | None
    run_at_column: str | None
    priority: int | None
    run_at: dt.datetime | None
    dedupe: str | None  # None, "key" or "hash"


# ------------------------------------------------------- Arrow to Python
def _utc(arrow_type: Any) -> Any:
    """``arrow_type`` with every zoned timestamp in UTC: Spark sends them in
    the session's zone, and the payload keeps a datetime's wall-clock time."""
    import pyarrow as pa

    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        return pa.timestamp(arrow_type.unit, tz="UTC")
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(_utc(f.type)) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        return pa.map_(_utc(arrow_type.key_type), _utc(arrow_type.item_type))
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_utc(arrow_type.value_type)))
    return arrow_type


def _has_map(arrow_type: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_map(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        return any(_has_map(f.type) for f in arrow_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _has_map(arrow_type.value_type)
    return False


def _maps_as_dicts(value: Any, arrow_type: Any) -> Any:
    """Arrow gives a map as a list of (key, value) pairs; a payload wants a dict."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(arrow_type):
        return {k: _maps_as_dicts(v, arrow_type.item_type) for k, v in value}
    if pa.types.is_struct(arrow_type):
        return {f.name: _maps_as_dicts(value[f.name], f.type) for f in arrow_type}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [_maps_as_dicts(v, arrow_type.value_type) for v in value]
    return value


def python_values(column: Any) -> list[Any]:
    """An Arrow column as the Python values Spark's ``collect()`` would
    give, but with zoned timestamps in UTC and maps as dicts."""
    utc = _utc(column.type)
    if utc != column.type:
        column = column.cast(utc)
    values: list[Any] = column.to_pylist()
    if _has_map(column.type):
        values = [_maps_as_dicts(value, column.type) for value in values]
    return values


# ------------------------------------------------------------ bad rows
def _shown(row: Mapping[str, Any]) -> str:
    text = redact(repr(dict(row)))
    return text if len(text) <= ROW_SHOWN_MAX_CHARS else text[: ROW_SHOWN_MAX_CHARS - 1] + "…"


def _bad_row(column: str, problem: str, row: Mapping[str, Any]) -> BadRowError:
    return BadRowError(f"{ERROR_MARK}column {column!r} {problem}; row: {_shown(row)}")


def _payload_error(spec: WriteSpec, payload: Any, row: Mapping[str, Any]) -> BadRowError:
    """Which payload column made the payload unserialisable, and why."""
    columns = spec.payload_columns
    if not spec.single_payload:
        for name in columns:
            try:
                serialize_payload(payload[name])
            except PayloadError as exc:
                return _bad_row(name, f"is not JSON: {_reason(exc)}", row)
    try:
        serialize_payload(payload)
    except PayloadError as exc:
        return _bad_row(columns[0] if columns else "payload", f"is not JSON: {_reason(exc)}", row)
    return _bad_row(",".join(columns), "is not JSON", row)  # pragma: no cover


def _reason(exc: PayloadError) -> str:
    return str(exc).removeprefix("the task payload cannot be serialised to JSON: ")


# ----------------------------------------------------------- dedupe locks
class _BucketLocks:
    """The dedupe locks of one partition (see the module docstring)."""

    def __init__(self, conn: Connection, adapter: Adapter, table: str) -> None:
        self.conn = conn
        self.adapter = adapter
        self.namespace = lock_namespace(table, "spark-dedupe")
        self.held: list[str] = []

    def take(self, buckets: Iterable[int]) -> None:
        for bucket in sorted(set(buckets)):
            try:
                name = self.adapter.bucket_lock(
                    self.conn,
                    namespace=self.namespace,
                    bucket=bucket,
                    wait_seconds=LOCK_WAIT_SECONDS,
                )
            except SqlaQueueError as exc:
                raise SqlaQueueError(f"{ERROR_MARK}{exc}") from None
            if name is not None:
                self.held.append(name)

    def release(self) -> None:
        """The locks that outlive the transaction: free them once committed."""
        for name in self.held:
            self.adapter.bucket_unlock(self.conn, name)
        self.held.clear()
        if self.conn.in_transaction():
            self.conn.commit()


def _existing_keys(
    conn: Connection, adapter: Adapter, spec: WriteSpec, keys: Sequence[tuple[Any, Any]]
) -> set[tuple[Any, Any]]:
    """Which (tenant, key) pairs the table has already, for the process."""
    # served by the equivalence index (chave_externa, payload_hash, status),
    # partial where the database can on a payload and a status other than
    # processando: without those conditions PostgreSQL scans the table for
    # every lookup. Running tasks come through their own index.
    equal: dict[str, Any] = {"processo": spec.process}
    not_null: tuple[str, ...]
    if spec.dedupe == "key":
        key_column, not_null = "chave_externa", ("payload_hash",)
    else:
        key_column, not_null = "payload_hash", ()
        equal["chave_externa"] = None
    found: set[tuple[Any, Any]] = set()
    wanted = sorted({key for _, key in keys})
    for start in range(0, len(wanted), EXISTING_KEYS_PER_QUERY):
        chunk = wanted[start : start + EXISTING_KEYS_PER_QUERY]
        rows = adapter.task_equivalents(
            conn,
            equal=equal,
            columns=("tenant", key_column),
            not_null=not_null,
            any_of=(key_column, chunk),
        )
        for tenant, key in rows:
            found.add((tenant, bytes(key) if isinstance(key, memoryview) else key))
    return found


# ---------------------------------------------------------- the partition
def _rows(spec: WriteSpec, batch: Any, now: dt.datetime) -> Iterator[dict[str, Any]]:
    """The task rows of one Arrow batch (seed column names)."""
    names = batch.schema.names
    present = set(names)

    def column(name: str) -> list[Any]:
        return python_values(batch.column(names.index(name)))

    payloads = [column(name) for name in spec.payload_columns]
    count = batch.num_rows
    absent = [None] * count
    keys = column(KEY) if KEY in present else absent
    tenants = column(TENANT) if TENANT in present else absent
    priorities = column(PRIORITY) if PRIORITY in present else [spec.priority] * count
    run_ats = column(RUN_AT) if RUN_AT in present else [spec.run_at] * count
    payload_names = spec.payload_columns
    values: dict[str, Any] = {"processo": spec.process}
    for i, row_values in enumerate(zip(*payloads, strict=True) if payloads else [()] * count):
        payload = (
            row_values[0]
            if spec.single_payload
            else dict(zip(payload_names, row_values, strict=True))
        )
        values["payload"] = payload
        values["chave_externa"] = keys[i]
        values["tenant"] = tenants[i]
        values["prioridade"] = priorities[i]
        values["data_hora"] = run_ats[i]
        key = keys[i]
        if isinstance(key, str) and len(key) > EXTERNAL_KEY_MAX_LENGTH:
            raise _bad_row(
                spec.key_column or "chave_externa",
                f"is longer than {EXTERNAL_KEY_MAX_LENGTH} characters",
                _user_row(spec, payload, values),
            )
        try:
            row = _task_row(values, pub_sub=False, now=now)
        except PayloadError:
            raise _payload_error(spec, payload, _user_row(spec, payload, values)) from None
        except InvalidTaskError as exc:
            # the general path's check, named as the user named the column
            named = _user_column(spec, exc.column) or exc.column or "?"
            raise _bad_row(
                named, exc.problem or str(exc), _user_row(spec, payload, values)
            ) from None
        _check_key(spec, row, values, payload)
        yield row


def _user_row(spec: WriteSpec, payload: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """The row as the user named its columns, for an error message."""
    row = (
        {spec.payload_columns[0]: payload}
        if spec.single_payload
        else dict(payload)
        if isinstance(payload, dict)
        else {}
    )
    for column, value in (
        (spec.key_column, values["chave_externa"]),
        (spec.tenant_column, values["tenant"]),
        (spec.priority_column, values["prioridade"]),
        (spec.run_at_column, values["data_hora"]),
    ):
        if column is not None:
            row.setdefault(column, value)
    return row


def _user_column(spec: WriteSpec, column: str | None) -> str | None:
    """The user's column that gives seed column ``column``, if any."""
    return {
        "chave_externa": spec.key_column,
        "tenant": spec.tenant_column,
        "prioridade": spec.priority_column,
        "data_hora": spec.run_at_column,
    }.get(column or "")


def _check_key(
    spec: WriteSpec, row: Mapping[str, Any], values: Mapping[str, Any], payload: Any
) -> None:
    key = row["chave_externa"]
    if spec.dedupe == "key" and key is None:
        raise _bad_row(
            spec.key_column or "chave_externa",
            "is null (dedupe needs a key on every row)",
            _user_row(spec, payload, values),
        )
    if spec.dedupe and row["payload_hash"] is None:
        # the lookup goes through the equivalence index, which holds the
        # tasks that have a payload (a partial index on PostgreSQL and SQLite)
        raise _bad_row(
            ",".join(spec.payload_columns) or "payload",
            "gives an empty payload (dedupe needs a payload on every row)",
            _user_row(spec, payload, values),
        )


# ------------------------------------------------- the COPY text fast path
#: COPY's text format: these four characters are escaped in a value
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
_COPY_NULL = "\\N"
#: what the fast path writes; the other columns take their defaults, which
#: are what _task_row gives a task without a run time
_COPY_COLUMNS = ("processo", "chave_externa", "payload", "payload_hash", "tenant", "prioridade")


def _copy_text(value: str | None) -> str:
    return _COPY_NULL if value is None else value.translate(_COPY_ESCAPES)


def _copy_int(value: int | None) -> str:
    return _COPY_NULL if value is None else str(value)


def _fast_path(conn: Connection, adapter: Adapter, spec: WriteSpec) -> bool:
    """Whether a batch may go to the table as COPY text made column by
    column (PostgreSQL on psycopg, no dedupe, no run time): the same task
    rows as the general path, without a Python object per value."""
    return (
        not spec.dedupe
        and spec.run_at is None
        and spec.run_at_column is None
        and adapter.can_copy_text(conn)
    )


#: printable ASCII without '"' and '\\': a JSON string of it is the text
#: between quotes (json.dumps with ensure_ascii escapes nothing else)
_PLAIN_TEXT = r"^[ !#-\[\]-~]*$"


def _json_column(column: Any) -> Any:
    """The JSON text of each value of an Arrow column, made by Arrow, for
    the types whose text json.dumps makes plainly (integers, booleans,
    printable ASCII strings without quote or backslash); None otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_integer(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = column.cast(pa.string())
        if pc.all(pc.match_substring_regex(column, _PLAIN_TEXT)).as_py() is False:
            return None
        text = pc.binary_join_element_wise('"', column, '"', "")
    else:
        return None
    return pc.fill_null(text, "null")


def _json_objects(spec: WriteSpec, batch: Any) -> list[str] | None:
    """The payload texts of a batch whose payload columns all have
    :func:`_json_column` texts: ``{"name": value, ...}`` assembled by Arrow,
    json.dumps's text of the same dict; None when a column does not."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if len(set(spec.payload_columns)) < len(spec.payload_columns):
        return None  # a dict keeps one of each key: the general path's text
    parts: list[Any] = []
    for i, name in enumerate(spec.payload_columns):
        text = _json_column(batch.column(names.index(name)))
        if text is None:
            return None
        parts += [pa.scalar(("{" if i == 0 else ", ") + json_key(name) + ": "), text]
    if not parts:
        return ["{}"] * batch.num_rows
    texts: list[str] = pc.binary_join_element_wise(*parts, pa.scalar("}"), "").to_pylist()
    return texts


def _copy_text_column(column: Any) -> list[str] | None:
    """An external key column as COPY text values, or None when a key is
    too long (a bad row). Escaped one by one only if one needs it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.cast(pa.string())
    if (pc.max(pc.utf8_length(column)).as_py() or 0) > EXTERNAL_KEY_MAX_LENGTH:
        return None
    if pc.any(pc.match_substring_regex(column, r"[\\\t\n\r]")).as_py():
        return [_copy_text(value) for value in column.to_pylist()]
    values: list[str] = pc.fill_null(column, _COPY_NULL).to_pylist()
    return values


def _copy_lines(spec: WriteSpec, batch: Any) -> str | None:
    """The batch as COPY text lines for :data:`_COPY_COLUMNS`, or None when a
    row is bad (the general path then names the column and shows the row).
    Each value is the general path's (``_task_row``): the same payload text
    and hash, the default priority, the status ``pendente``."""
    names = batch.schema.names
    present = set(names)

    def column(name: str) -> list[Any]:
        return python_values(batch.column(names.index(name)))

    count = batch.num_rows
    raw: list[str | None]
    if spec.single_payload:
        raw = [serialize_payload(value) for value in column(spec.payload_columns[0])]
    else:
        by_arrow = _json_objects(spec, batch)
        if by_arrow is not None:
            raw = list(by_arrow)
        else:
            payloads = [column(name) for name in spec.payload_columns]
            payload_names = spec.payload_columns
            rows = zip(*payloads, strict=True) if payloads else [()] * count
            raw = [
                serialize_payload(dict(zip(payload_names, values, strict=True))) for values in rows
            ]
    if KEY in present:
        keys = _copy_text_column(batch.column(names.index(KEY)))
        if keys is None:
            return None
    else:
        keys = [_COPY_NULL] * count
    hashes = [digest or _COPY_NULL for digest in hash_payload_texts(raw)]
    if spec.single_payload:
        texts = [_copy_text(text) for text in raw]
    else:  # the JSON text of an object: a backslash is the one character to escape
        texts = [text.replace("\\", "\\\\") for text in raw]  # type: ignore[union-attr]
    if TENANT in present:
        tenants: Iterable[str] = [_copy_int(t) for t in column(TENANT)]
    else:
        tenants = itertools.repeat(_COPY_NULL, count)
    if PRIORITY in present:
        priorities: Iterable[str] = [
            _copy_int(DEFAULT_PRIORITY if p is None else p) for p in column(PRIORITY)
        ]
    else:
        priority = DEFAULT_PRIORITY if spec.priority is None else int(spec.priority)
        priorities = itertools.repeat(_copy_int(priority), count)
    columns = (
        itertools.repeat(_copy_text(spec.process), count),
        keys,
        texts,
        hashes,
        tenants,
        priorities,
    )
    return "\n".join(map("\t".join, zip(*columns, strict=True))) + "\n"


def _checked_lines(spec: WriteSpec, batch: Any, now: dt.datetime) -> str:
    """:func:`_copy_lines`, or the general path's BadRowError for the batch."""
    try:
        lines = _copy_lines(spec, batch)
    except PayloadError:
        lines = None
    if lines is None:
        list(_rows(spec, batch, now))  # raises the error that names the column
        raise SqlaQueueError(f"{ERROR_MARK}a row the fast path refused passed the checks")
    return lines


def _copy_all(
    conn: Connection,
    adapter: Adapter,
    spec: WriteSpec,
    batches: Iterable[Any],
    now: dt.datetime,
    counts: dict[str, int],
) -> None:
    """The partition in one COPY, its batches made one after another while
    psycopg's writer thread sends the previous one. A bad row raises
    inside the COPY, which aborts it; the partition's transaction rolls back."""

    def chunks() -> Iterator[str]:
        for batch in batches:
            lines = _checked_lines(spec, batch, now)
            counts["rows"] += batch.num_rows
            counts["enqueued"] += batch.num_rows
            yield lines

    made = chunks()
    first = next(made, None)
    if first is not None:  # no COPY (and no trigger) for an empty partition
        adapter.task_copy_text(conn, columns=_COPY_COLUMNS, chunks=itertools.chain([first], made))


def _insert(conn: Connection, adapter: Adapter, rows: list[dict[str, Any]]) -> int:
    """Rows with and without a run time go apart: one shape per statement."""
    inserted = 0
    for scheduled in (False, True):
        group = [row for row in rows if ("data_hora" in row) == scheduled]
        if group:
            inserted += len(adapter.task_insert_many(conn, rows=group))
    return inserted


def write_partition(spec: WriteSpec, batches: Iterable[Any]) -> Iterator[Any]:
    """Spark's ``mapInArrow`` function: write the partition, yield its counts."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    batches = list(batches) if spec.dedupe else batches
    table = resolve_table(spec.table)
    engine = create_engine(spec.url, poolclass=NullPool)
    counts = {"rows": 0, "enqueued": 0, "duplicates": 0}
    error = None
    try:
        adapter = adapter_for(engine.dialect, table, spec.channel)
        adapter.prepare_engine(engine)
        conn = adapter.connect_bulk(engine)
        try:
            _write(conn, adapter, spec, batches, counts)
        finally:
            conn.close()
    except BadRowError as exc:
        # the partition rolled back. Reported, not raised: a retry of the
        # task would fail the same way, and the Python worker lives on
        error = str(exc).removeprefix(ERROR_MARK)
        counts = dict.fromkeys(counts, 0)
    except SqlaQueueError:
        raise
    except Exception as exc:
        # the driver's own words only: SQLAlchemy's text carries the SQL and
        # the rows' values, which may hold anything
        # libpq's texts run over lines: one line, as the job's error shows one
        cause = " ".join(describe_error(exc).split())
        raise SqlaQueueError(
            f"{ERROR_MARK}partition {partition}: {cause[:MESSAGE_MAX_LENGTH]}"
        ) from None
    finally:
        engine.dispose()
    counters = [(name, pa.int64()) for name in ("rows", "enqueued", "duplicates")]
    schema = pa.schema([("partition", pa.int32()), *counters, ("error", pa.string())])
    result = {"partition": partition, **counts, "error": error}
    yield pa.RecordBatch.from_pylist([result], schema=schema)


def _write(
    conn: Connection,
    adapter: Adapter,
    spec: WriteSpec,
    batches: Iterable[Any],
    counts: dict[str, int],
) -> None:
    locks = _BucketLocks(conn, adapter, spec.table) if spec.dedupe else None
    seen: set[tuple[Any, Any]] = set()
    now = utcnow()
    with conn.begin():
        if locks is not None:
            buckets: set[int] = set()
            for batch in batches:
                buckets.update(batch.column(batch.schema.names.index(BUCKET)).to_pylist())
            locks.take(buckets)
        if _fast_path(conn, adapter, spec):
            _copy_all(conn, adapter, spec, batches, now, counts)
        else:
            for batch in batches:
                rows = list(_rows(spec, batch, now))
                counts["rows"] += len(rows)
                if spec.dedupe:
                    rows = _new_rows(conn, adapter, spec, rows, seen)
                    counts["duplicates"] += batch.num_rows - len(rows)
                if rows:
                    counts["enqueued"] += _insert(conn, adapter, rows)
        if counts["enqueued"] and adapter.supports_notify:
            adapter.notify(conn)
    if locks is not None:
        locks.release()


def _new_rows(
    conn: Connection,
    adapter: Adapter,
    spec: WriteSpec,
    rows: list[dict[str, Any]],
    seen: set[tuple[Any, Any]],
) -> list[dict[str, Any]]:
    """``rows`` less those whose key the table or this partition has already."""
    field = "chave_externa" if spec.dedupe == "key" else "payload_hash"
    keys = [(row["tenant"], row[field]) for row in rows]
    existing = _existing_keys(conn, adapter, spec, [k for k in keys if k not in seen])
    fresh = []
    for key, row in zip(keys, rows, strict=True):
        if key in seen or key in existing:
            continue
        seen.add(key)
        fresh.append(row)
    return fresh


_PYTHON_ERROR = re.compile(r"^(?:\w+\.)*(\w+(?:Error|Exception)): (.*)$", re.MULTILINE)


def cause_of(exc: BaseException) -> str:
    """The cause of a failed job, from the text of the error Spark gives
    the driver (it wraps the executor's traceback): the message a partition
    raised, else the last Python error in the traceback, else the first line."""
    text = str(exc)
    match = re.search(re.escape(ERROR_MARK) + r"(.*)", text)
    if match:
        return match.group(1).strip()
    errors = _PYTHON_ERROR.findall(text)
    if errors:
        name, message = errors[-1]
        if name == "ModuleNotFoundError":
            return (
                f"the executors' Python cannot import it ({message}): set PYSPARK_PYTHON "
                "(or spark.pyspark.python) to an interpreter with sqla-queue installed"
            )
        return redact(f"{name}: {message}")
    return redact(text.strip().splitlines()[0] if text.strip() else type(exc).__name__)
