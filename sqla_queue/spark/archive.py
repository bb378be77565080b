"""Archive before purge: whole chains to a dataset partitioned by day, then deleted.

A **family** is a task's whole history: its chain (first attempt and
retries, ``coalesce(id_inicial, id)``), the dead-letter run it started and
the chain requeued from that run (rows with ``live_id`` pointing at the
chain, retries included: the dead-letter run is what says the task was
requeued, so the two are never deleted apart). It is archived and deleted
whole or not at all, and only when it is closed (no attempt ``agendada``,
``pendente`` or ``processando``) and older than the retention (its last due
time and last end both before the cutoff). All rows of a family go to the
day partition of the day it started (``day=YYYY-MM-DD``, UTC).

The archive is a set of rows keyed by ``id`` (ids are never reused), which
is what makes every step safe to crash in and every run safe to repeat:

1. take the archive lock (the queue's maintenance lock ``ARCHIVE_LOCK_KEY``:
   one archive at a time, the job or the purge's hook), remove what a
   crashed run left in ``<path>/_staging``;
2. read the closed, old families (Spark's JDBC source for the job; the
   purge's own transaction for the hook);
3. leave out the rows whose id the archive has already;
4. write the others to ``<path>/_staging/<run>`` and check the count read
   back there (readers of the dataset skip ``_``-folders);
5. move the files into the dataset's day folders, one rename each;
6. check that every row of the families is in the dataset exactly once;
7. (the job) delete the families from the database, ``chunk_families`` per
   transaction, each chunk checked: the rows deleted are the rows archived
   and the families have no row left; else the chunk rolls back. (The hook
   returns instead, and the purge deletes.)

A crash before 5 leaves the dataset as it was; during 5, some rows are in
it and step 3 of the next run leaves them out; after 5, the next run finds
all of them there, writes nothing and deletes. Nothing is deleted that step
6 did not find, so nothing is lost; nothing is written whose id is in the
dataset, so nothing is archived twice.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table, create_engine
from sqlalchemy.engine import URL

from ..adapters import Adapter, adapter_for, adapter_of
from ..adapters.archive import family_rows
from ..client.queue import resolve_table
from ..common.exceptions import ConfigurationError, SparkJobError, UnsupportedOperationError
from ..common.types import utcnow
from ..config.settings import normalize_url
from ..schema.mixins import OPEN_STATUSES, QueueMixin
from .jdbc import read_queue

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

__all__ = ["ARCHIVE_LOCK_KEY", "ArchiveHook", "ArchiveResult", "archive_chains", "family_rows"]

#: the queue's maintenance lock that one archive run holds (job or hook)
ARCHIVE_LOCK_KEY = 17
DEFAULT_CHUNK_FAMILIES = 1000
STAGING = "_staging"
FORMATS = ("parquet", "orc")


@dataclass(frozen=True)
class ArchiveResult:
    """What one archive run did."""

    families: int  # closed families older than the retention found
    rows: int  # their rows
    written: int  # rows appended to the dataset by this run
    already_archived: int  # rows a previous (crashed) run had appended
    deleted: int  # rows deleted from the database (the job only)
    skipped_families: int  # families left in the database: they changed meanwhile


# ---------------------------------------------------------------- schema
def _spark_type(column: Any) -> DataType:
    """The archive's type of a table column: the same whichever way the rows
    came (JDBC, or the purge's connection), so the dataset has one schema."""
    from pyspark.sql import types as T

    # a TypeDecorator (UtcDateTime, PayloadHash) says "object": ask its impl
    column_type = getattr(column.type, "impl_instance", column.type)
    try:
        python_type = column_type.python_type
    except NotImplementedError:
        return T.StringType()
    if python_type is bool:
        return T.BooleanType()
    if python_type is int:
        return T.IntegerType() if column.name in ("tentativa", "prioridade") else T.LongType()
    if python_type is float:
        return T.DoubleType()
    if python_type is decimal.Decimal:
        return T.DecimalType(38, 10)
    if python_type is dt.datetime:
        return T.TimestampType()
    if python_type is dt.date:
        return T.DateType()
    if python_type is bytes:
        return T.BinaryType()
    return T.StringType()


def archive_schema(table: Table) -> StructType:
    from pyspark.sql import types as T

    return T.StructType([T.StructField(c.name, _spark_type(c), True) for c in table.c])


def _typed(frame: DataFrame, table: Table) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.select(
        *(F.col(f.name).cast(f.dataType).alias(f.name) for f in archive_schema(table).fields)
    )


def _root() -> Column:
    """A row's family: the chain it belongs to, or for a dead-letter run and
    a chain requeued from it (both carry ``live_id``) the live chain they
    came from, as the purge's ``family_key``."""
    from pyspark.sql import functions as F

    return F.when(F.col("live_id").isNotNull(), F.col("live_id")).otherwise(
        F.coalesce("id_inicial", "id")
    )


def _with_family(frame: DataFrame) -> DataFrame:
    """Rows with their family (``_root``) and its day (``day``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    family = Window.partitionBy("_root")
    started = F.min(F.coalesce("data_hora_inicial", "data_hora")).over(family)
    return frame.withColumn("_root", _root()).withColumn("day", F.to_date(started))


def closed_families(frame: DataFrame, cutoff: dt.datetime) -> DataFrame:
    """The rows of the families that are closed and older than ``cutoff``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    family = Window.partitionBy("_root")
    last = F.greatest(F.col("data_hora"), F.coalesce("finished_at", "data_hora"))
    is_open = F.col("status").isin(*OPEN_STATUSES).cast("int")
    cutoff_literal = F.lit(cutoff).cast("timestamp")
    return (
        _with_family(frame)
        .withColumn("_open", F.max(is_open).over(family))
        .withColumn("_last", F.max(last).over(family))
        .where((F.col("_open") == 0) & (F.col("_last") < cutoff_literal))
        .drop("_open", "_last")
    )


# ---------------------------------------------------------------- the sink
class _Dataset:
    """The archive's files, through Hadoop's FileSystem (local, HDFS, S3...)."""

    def __init__(self, spark: SparkSession, path: str, file_format: str) -> None:
        if file_format not in FORMATS:
            raise ConfigurationError(
                f"format={file_format!r}: one of {', '.join(FORMATS)} (a file format "
                "Spark writes partitioned by day)"
            )
        self.spark = spark
        self.format = file_format
        jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._path_class = jvm.org.apache.hadoop.fs.Path
        root = self._path_class(path)
        self.fs = root.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
        self.root = self.fs.makeQualified(root)
        self.path = self.root.toString()

    def _child(self, *parts: str) -> Any:
        return self._path_class(self.path + "/" + "/".join(parts))

    def clear_staging(self) -> None:
        """What a crashed run left: never read, never published."""
        self.fs.delete(self._child(STAGING), True)

    def archived_ids(self, low: int, high: int) -> DataFrame | None:
        """The ids from ``low`` to ``high`` the dataset holds, in any day
        (None: there is no dataset). The Parquet files' statistics on ``id``
        spare reading most of them."""
        from pyspark.sql import functions as F

        if not self.fs.exists(self.root):
            return None
        if not any(
            status.isDirectory() and status.getPath().getName().startswith("day=")
            for status in self.fs.listStatus(self.root)
        ):
            return None
        frame = self.spark.read.format(self.format).load(self.path)
        return frame.where(F.col("id").between(low, high)).select("id")

    def stage(self, rows: DataFrame, run: str) -> str:
        staging = f"{self.path}/{STAGING}/{run}"
        rows.write.format(self.format).partitionBy("day").mode("overwrite").save(staging)
        return staging

    def count(self, location: str, ids: DataFrame | None = None) -> tuple[int, int]:
        """(rows, distinct ids) at ``location``, of ``ids`` only when given."""
        from pyspark.sql import functions as F

        frame = self.spark.read.format(self.format).load(location).select("id", "day")
        if ids is not None:
            frame = frame.join(ids, "id", "left_semi")
        counts = frame.agg(F.count("id").alias("n"), F.count_distinct("id").alias("d")).collect()[0]
        return int(counts["n"] or 0), int(counts["d"] or 0)

    def publish(self, staging: str, run: str) -> int:
        """Move the staged files into the dataset's day folders; how many."""
        moved = 0
        for day in self.fs.listStatus(self._path_class(staging)):
            name = day.getPath().getName()
            if not (day.isDirectory() and name.startswith("day=")):
                continue
            target = self._child(name)
            self.fs.mkdirs(target)
            for part in self.fs.listStatus(day.getPath()):
                file_name = part.getPath().getName()
                if part.isDirectory() or file_name.startswith(("_", ".")):
                    continue
                destination = self._path_class(target, f"{run}-{file_name}")
                if not self.fs.rename(part.getPath(), destination):
                    raise SparkJobError(f"could not move {part.getPath()} to {destination}")
                moved += 1
        self.fs.delete(self._path_class(staging), True)
        return moved


def append_families(spark: SparkSession, rows: DataFrame, dataset: _Dataset) -> tuple[int, int]:
    """Steps 3 to 6 for ``rows`` (``_with_family`` rows): (rows written,
    rows already archived). Raises if the dataset does not then hold every
    row exactly once."""
    from pyspark.sql import functions as F

    bounds = rows.agg(F.count("id"), F.min("id"), F.max("id")).collect()[0]
    total = int(bounds[0])
    if total == 0:
        return 0, 0
    archived = dataset.archived_ids(int(bounds[1]), int(bounds[2]))
    fresh = rows if archived is None else rows.join(archived, "id", "left_anti")
    fresh = fresh.drop("_root")
    written = fresh.count()
    if written:
        run = f"{utcnow():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        staging = dataset.stage(fresh, run)
        staged = dataset.count(staging)
        if staged != (written, written):
            raise SparkJobError(
                f"archive check failed: {written} rows written, {staged[0]} read back "
                f"({staged[1]} distinct) in {staging}; nothing was deleted"
            )
        dataset.publish(staging, run)
    present = dataset.count(dataset.path, rows.select("id").where(F.col("id").isNotNull()))
    if present != (total, total):
        raise SparkJobError(
            f"archive check failed: of {total} rows, {present[1]} are in {dataset.path} "
            f"({present[0]} copies); nothing was deleted"
        )
    return written, total - written


# ---------------------------------------------------------------- the lock
class _ArchiveLock:
    """The queue's maintenance lock ARCHIVE_LOCK_KEY on ``conn``."""

    def __init__(self, conn: Connection, table: Table) -> None:
        channel = table.info.get("sqla_queue", {}).get("channel") or table.name
        self.conn = conn
        self.adapter: Adapter = adapter_for(conn.dialect, table, channel)
        self.held = False

    def take(self) -> None:
        try:
            self.held = self.adapter.lock_try(self.conn, key=ARCHIVE_LOCK_KEY)
        except UnsupportedOperationError:
            return  # SQLite: the purge's transaction holds the write lock
        if not self.held:
            raise SparkJobError(
                f"another archive of {self.adapter.qualified_name} is running (its lock is held)"
            )

    def release(self) -> None:
        if self.held:
            self.adapter.lock_release(self.conn, key=ARCHIVE_LOCK_KEY)
            self.held = False


# ---------------------------------------------------------------- the job
def _local(path: str) -> str:
    """A path without a scheme is local: made absolute (Spark and Hadoop
    would resolve it against different folders)."""
    from pathlib import Path

    return path if "://" in path or path.startswith("file:") else str(Path(path).resolve())


def archive_chains(
    spark: SparkSession,
    url: str | URL,
    model_or_table: str | type[QueueMixin] | Table,
    path: str,
    *,
    retention_days: float,
    now: dt.datetime | None = None,
    chunk_families: int = DEFAULT_CHUNK_FAMILIES,
    file_format: str = "parquet",
    partitions: int | None = None,
) -> ArchiveResult:
    """Archive the closed families older than ``retention_days`` to the
    dataset at ``path``, then delete them (see the module docstring)."""
    if not retention_days >= 0 or retention_days > 100 * 366:
        raise ConfigurationError(f"retention_days: 0 to 36600 days, not {retention_days!r}")
    if chunk_families < 1:
        raise ConfigurationError(f"chunk_families: at least 1, not {chunk_families!r}")
    table = resolve_table(model_or_table)
    cutoff = (now or utcnow()) - dt.timedelta(days=retention_days)
    dataset = _Dataset(spark, _local(path), file_format)
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as lock_conn:
            lock = _ArchiveLock(lock_conn, table)
            lock.take()
            lock_conn.commit()
            try:
                return _archive(
                    spark, url, table, dataset, cutoff, chunk_families, partitions, engine
                )
            finally:
                lock.release()
                lock_conn.commit()
    finally:
        engine.dispose()


def _archive(
    spark: SparkSession,
    url: str | URL,
    table: Table,
    dataset: _Dataset,
    cutoff: dt.datetime,
    chunk_families: int,
    partitions: int | None,
    engine: Any,
) -> ArchiveResult:
    dataset.clear_staging()
    frame = _typed(read_queue(spark, url, table, partitions=partitions), table)
    rows = closed_families(frame, cutoff).cache()
    try:
        written, already = append_families(spark, rows, dataset)
        pairs = sorted((row["_root"], row["id"]) for row in rows.select("_root", "id").collect())
        families = len({root for root, _ in pairs})
        total = written + already
        deleted = skipped = 0
        for roots, ids in _chunks(pairs, chunk_families):
            done = _delete_chunk(engine, table, roots, ids)
            deleted += done
            skipped += 0 if done else len(roots)
    finally:
        rows.unpersist()
    return ArchiveResult(families, total, written, already, deleted, skipped)


def _chunks(pairs: Sequence[tuple[int, int]], size: int) -> Iterator[tuple[list[int], list[int]]]:
    """(families, row ids) ``size`` families at a time, from sorted (family,
    id) pairs. The driver holds them: 16 bytes a row."""
    roots: list[int] = []
    ids: list[int] = []
    for root, row_id in pairs:
        if not roots or roots[-1] != root:
            if len(roots) == size:
                yield roots, ids
                roots, ids = [], []
            roots.append(root)
        ids.append(row_id)
    if roots:
        yield roots, ids


def _delete_chunk(engine: Any, table: Table, roots: list[int], ids: list[int]) -> int:
    """Delete the rows ``ids`` of the families ``roots`` in one transaction,
    if they are still exactly those families' rows, closed; rows deleted."""
    queries = adapter_of(engine.dialect, table).archive
    with engine.connect() as conn, conn.begin() as transaction:
        deleted = queries.delete_closed(conn, ids=ids)
        left = queries.family_count(conn, roots=roots)
        if deleted != len(ids) or left:
            # a family gained a row (a requeue) or lost one (a purge) meanwhile:
            # it stays as it is, and in the dataset; a later run finishes it
            transaction.rollback()
            return 0
    return deleted


# ---------------------------------------------------------------- the hook
class ArchiveHook:
    """The purge routine's ``before_delete``: archives the chains it is
    about to delete, in its transaction, and raises (the chunk is then not
    deleted) unless every row is in the dataset exactly once.

    ``hook(conn, table, chain_ids)`` reads the families of ``chain_ids``
    (their chains and dead-letter runs) on the purge's connection, so it
    archives exactly what the purge sees. The SparkSession is ``spark``, or
    one started on the first call (``master``, default ``local[1]``)."""

    def __init__(
        self,
        path: str,
        *,
        file_format: str = "parquet",
        spark: SparkSession | None = None,
        master: str | None = None,
    ) -> None:
        if file_format not in FORMATS:
            raise ConfigurationError(f"file_format={file_format!r}: one of {', '.join(FORMATS)}")
        self.path = _local(path)
        self.file_format = file_format
        self._spark = spark
        self.master = master or "local[1]"

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from .session import spark_session

            self._spark = spark_session(self.master, app_name="sqla-queue archive")
        return self._spark

    def __call__(self, conn: Connection, table: Table, chain_ids: Sequence[int]) -> None:
        if not chain_ids:
            return
        lock = _ArchiveLock(conn, table)
        lock.take()
        try:
            dataset = _Dataset(self.spark, self.path, self.file_format)
            dataset.clear_staging()
            # whole families, even when chain_ids names a dead-letter run
            # alone: a row's day is its family's, whoever archives it
            queries = lock.adapter.archive
            roots = queries.family_roots(conn, chain_ids=chain_ids)
            records = queries.family_records(conn, roots=roots)
            frame = self.spark.createDataFrame(records, archive_schema(table))
            append_families(self.spark, _with_family(frame), dataset)
        finally:
            lock.release()
