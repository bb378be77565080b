"""Bulk enqueue from a DataFrame: one task per row, a transaction per partition.

The driver checks the arguments against the DataFrame's schema (a wrong
column name or type fails here, before any row is written), selects the
columns the tasks need, and, with ``dedupe=True``, sends every row of a key
bucket to one partition. The executors do the writing
(:mod:`sqla_queue.spark.writer`), each partition in one transaction.

What a run guarantees: a partition is written whole or not at all. Without
``dedupe``, a partition that Spark runs twice (a retried task, a second run
of the job) is enqueued twice; with ``dedupe=True`` and a key, never.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table
from sqlalchemy.engine import URL

from ..client.queue import resolve_table
from ..common.exceptions import ConfigurationError, SparkJobError
from ..config.settings import normalize_url
from ..schema.mixins import QueueMixin
from . import writer
from .writer import BUCKET, KEY, LOCK_BUCKETS, PRIORITY, RESERVED, RUN_AT, TENANT, WriteSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["EnqueueResult", "enqueue_dataframe"]

PROCESS_MAX_LENGTH = 250  # processo varchar(250)


@dataclass(frozen=True)
class EnqueueResult:
    """What one run of :func:`enqueue_dataframe` did."""

    rows: int  # rows of the DataFrame
    enqueued: int  # tasks written
    duplicates: int  # rows skipped by dedupe (key in the table or seen before)
    partitions: int


def _table_of(model_or_table: str | type[QueueMixin] | Table) -> tuple[str, str]:
    """(qualified name, NOTIFY channel) of the queue table."""
    table = resolve_table(model_or_table)
    info = table.info.get("sqla_queue", {})
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return name, info.get("channel") or table.name


def _column(df: DataFrame, argument: str, name: str) -> Any:
    """The schema field ``name`` of ``df``, or a one-line error naming ``argument``."""
    fields = {field.name: field for field in df.schema.fields}
    if name not in fields:
        raise ConfigurationError(
            f"{argument}={name!r}: no such column (the DataFrame has {', '.join(fields) or 'none'})"
        )
    if name in RESERVED:
        raise ConfigurationError(f"{argument}={name!r}: a name sqla-queue uses itself")
    return fields[name]


def _integral(df: DataFrame, argument: str, name: str) -> None:
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType

    field = _column(df, argument, name)
    if not isinstance(field.dataType, (ByteType, ShortType, IntegerType, LongType)):
        raise ConfigurationError(
            f"{argument}={name!r}: an integer column is needed, not {field.dataType.simpleString()}"
        )


def _one_of(first: str, first_value: Any, second: str, second_value: Any) -> None:
    if first_value is not None and second_value is not None:
        raise ConfigurationError(f"give {first} or {second}, not both")


def enqueue_dataframe(
    df: DataFrame,
    url: str | URL,
    model_or_table: str | type[QueueMixin] | Table,
    *,
    process: str,
    payload_cols: list[str] | tuple[str, ...] | None = None,
    payload_col: str | None = None,
    external_key_col: str | None = None,
    tenant_col: str | None = None,
    priority: int | None = None,
    priority_col: str | None = None,
    run_at: dt.datetime | None = None,
    run_at_col: str | None = None,
    dedupe: bool = False,
) -> EnqueueResult:
    """Enqueue one task per row of ``df`` into the queue table at ``url``.

    The payload is a dict of ``payload_cols`` (in that order), or the value of
    ``payload_col``, or (neither given) a dict of every column. Values become
    JSON as the ORM path makes them (docs/payload.md); a TIMESTAMP is written
    as its UTC time, a map as an object. ``external_key_col`` (cast to a
    string), ``tenant_col`` (an integer column), ``priority``/``priority_col``
    and ``run_at``/``run_at_col`` fill those columns (a null priority is the
    default, 50; a null or absent run time is now; a TIMESTAMP_NTZ is taken
    as UTC). ``dedupe=True`` skips rows whose key the table has already
    (docs/spark-enqueue.md)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    if not isinstance(process, str) or not process or len(process) > PROCESS_MAX_LENGTH:
        raise ConfigurationError(f"process: a name of 1 to {PROCESS_MAX_LENGTH} characters")
    _one_of("payload_cols", payload_cols, "payload_col", payload_col)
    _one_of("priority", priority, "priority_col", priority_col)
    _one_of("run_at", run_at, "run_at_col", run_at_col)
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ConfigurationError(f"priority: an integer, not {priority!r}")
    if run_at is not None and not isinstance(run_at, dt.datetime):
        raise ConfigurationError(f"run_at: a datetime, not {run_at!r}")
    if payload_col is not None:
        payload_columns: tuple[str, ...] = (payload_col,)
        _column(df, "payload_col", payload_col)
    else:
        payload_columns = tuple(payload_cols if payload_cols is not None else df.columns)
        for name in payload_columns:
            _column(df, "payload_cols", name)
    selected: list[Column] = [F.col(f"`{name}`") for name in payload_columns]
    if external_key_col is not None:
        _column(df, "external_key_col", external_key_col)
        selected.append(F.col(f"`{external_key_col}`").cast("string").alias(KEY))
    if tenant_col is not None:
        _integral(df, "tenant_col", tenant_col)
        selected.append(F.col(f"`{tenant_col}`").cast("long").alias(TENANT))
    if priority_col is not None:
        _integral(df, "priority_col", priority_col)
        selected.append(F.col(f"`{priority_col}`").cast("int").alias(PRIORITY))
    if run_at_col is not None:
        field = _column(df, "run_at_col", run_at_col)
        if not isinstance(field.dataType, (TimestampType, TimestampNTZType)):
            raise ConfigurationError(
                f"run_at_col={run_at_col!r}: a timestamp column is needed, "
                f"not {field.dataType.simpleString()}"
            )
        selected.append(F.col(f"`{run_at_col}`").alias(RUN_AT))
    if run_at is not None and run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=dt.timezone.utc)
    table, channel = _table_of(model_or_table)
    spec = WriteSpec(
        url=normalize_url(url).render_as_string(hide_password=False),
        table=table,
        channel=channel,
        process=process,
        payload_columns=payload_columns,
        single_payload=payload_col is not None,
        key_column=external_key_col,
        tenant_column=tenant_col,
        priority_column=priority_col,
        run_at_column=run_at_col,
        priority=priority,
        run_at=run_at,
        dedupe=None if not dedupe else "key" if external_key_col is not None else "hash",
    )
    frame = df.select(*selected)
    if spec.dedupe == "key":
        # every row of a key bucket in one partition: the partitions of a job
        # hold disjoint buckets and lock them without waiting for each other
        tenant = F.coalesce(F.col(TENANT), F.lit(-1)) if tenant_col else F.lit(-1)
        bucket = F.pmod(F.xxhash64(tenant, F.col(KEY)), F.lit(LOCK_BUCKETS)).cast("int")
        frame = frame.withColumn(BUCKET, bucket)
        frame = frame.repartition(max(df.rdd.getNumPartitions(), 1), BUCKET)
    elif spec.dedupe == "hash":
        # the payload hash is computed by the executors: one bucket, so the
        # partitions write in turn (give an external key to write in parallel)
        frame = frame.withColumn(BUCKET, F.lit(0))
    return _run(frame, spec)


def _run(frame: DataFrame, spec: WriteSpec) -> EnqueueResult:
    def write(batches: Any) -> Any:
        return writer.write_partition(spec, batches)

    try:
        results = frame.mapInArrow(write, writer.RESULT_SCHEMA).collect()
    except Exception as exc:
        raise SparkJobError(f"the enqueue job failed: {writer.cause_of(exc)}") from None
    errors = sorted((r["partition"], r["error"]) for r in results if r["error"])
    if errors:
        partition, error = errors[0]
        others = f" (and {len(errors) - 1} other partitions)" if len(errors) > 1 else ""
        written = sum(r["enqueued"] for r in results)
        raise SparkJobError(
            f"the enqueue job failed: partition {partition}{others}: {error}; the failed "
            f"partitions wrote nothing, the others {written:,} tasks"
        )
    return EnqueueResult(
        rows=sum(r["rows"] for r in results),
        enqueued=sum(r["enqueued"] for r in results),
        duplicates=sum(r["duplicates"] for r in results),
        partitions=len(results),
    )
