"""``sqla-queue spark enqueue|report|archive``: the Spark jobs as commands.

Importing this module does not import PySpark: each command does, and a
missing PySpark, Java or JDBC jar is one line naming what to install.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ..common.exceptions import ConfigurationError, SqlaQueueError
from ..common.identifiers import split_table_name
from ..common.redaction import escape_controls
from ..common.types import dialect_family
from ..config.ranges import CHUNK_FAMILIES, PRIORITY, RETENTION_DAYS, SPARK_LISTED, SPARK_PARTITIONS
from ..config.settings import database_url, normalize_url
from .checks import Number

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

RETENTION_VARIABLE = "QUEUE_PURGE_MAX_AGE"


def _echo(line: str) -> None:
    click.echo(escape_controls(line), err=True)


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: give KEY=VALUE", param_hint=option)
        pairs[key] = item
    return pairs


def _url(url: str | None, table: str) -> str:
    """The database URL, with the table name checked too: both before Spark
    starts (seconds), so that a typo costs nothing."""
    split_table_name(table)
    resolved = normalize_url(url) if url else database_url()
    if resolved is None:
        raise ConfigurationError("no database: give --url, or set SQLA_QUEUE_URL (or DB_*)")
    return resolved.render_as_string(hide_password=False)


@contextmanager
def _session(
    master: str, jars: Sequence[str], conf: Sequence[str], url: str, jdbc: bool
) -> Iterator[SparkSession]:
    """The session for one command, errors as one line; stopped at the end
    unless it was running before (an application calling the command)."""
    from pyspark.sql import SparkSession

    from ..spark.session import jdbc_jars, spark_session

    config = _pairs(conf, "--conf")
    family = dialect_family(normalize_url(url).get_backend_name())
    paths = jdbc_jars([family] if jdbc else [], given=jars) if jdbc or jars else []
    running = SparkSession.getActiveSession() is not None
    session = spark_session(master, jars=paths, config=config)
    try:
        yield session
    finally:
        if not running:
            session.stop()


def _run(job: Any) -> Any:
    """``job()``, with sqla-queue's and Spark's input errors, and a missing
    PySpark (the extra), as one line."""
    try:
        return job()
    except SqlaQueueError as exc:
        raise click.ClickException(escape_controls(str(exc))) from exc
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in ("pyspark", "py4j"):
            raise
        from ..spark.session import NO_PYSPARK

        raise click.ClickException(NO_PYSPARK) from exc
    except Exception as exc:
        # Spark's AnalysisException (a missing input path, a bad option...)
        from ..spark.writer import cause_of

        if type(exc).__name__ in ("AnalysisException", "IllegalArgumentException"):
            raise click.ClickException(escape_controls(cause_of(exc))) from exc
        raise


_common = [
    click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]"),
    click.option(
        "--table", required=True, help="the queue table (schema.table); validated identifiers"
    ),
    click.option(
        "--master", default="local[*]", show_default=True, help="Spark master URL (local[2], ...)"
    ),
    click.option(
        "--jdbc-jar",
        "jdbc_jars",
        multiple=True,
        help="JDBC driver jar path (default: Debian's, /usr/share/java/...)",
    ),
    click.option("--conf", multiple=True, help="Spark setting KEY=VALUE (repeatable)"),
]


def _common_options(function: Any) -> Any:
    for option in reversed(_common):
        function = option(function)
    return function


@click.group()
def spark() -> None:
    """The data pipeline on Apache Spark (pip install 'sqla-queue[spark]')."""


@spark.command()
@click.argument("source")
@_common_options
@click.option("--format", "source_format", default="parquet", show_default=True)
@click.option("--option", "source_options", multiple=True, help="reader option KEY=VALUE")
@click.option("--process", required=True, help="the tasks' processo")
@click.option("--payload-cols", help="comma-separated columns: the payload is their dict")
@click.option("--payload-col", help="the column whose value is the payload")
@click.option("--external-key-col", help="the column of chave_externa (cast to a string)")
@click.option("--tenant-col", help="the integer column of tenant")
@click.option("--priority", type=Number(PRIORITY), help="prioridade of every task")
@click.option("--priority-col", help="the integer column of prioridade")
@click.option("--run-at", type=click.DateTime(), help="when the tasks are due (UTC)")
@click.option("--run-at-col", help="the timestamp column of the due time")
@click.option("--dedupe", is_flag=True, help="skip rows whose key the table has already")
def enqueue(
    source: str,
    url: str | None,
    table: str,
    master: str,
    jdbc_jars: tuple[str, ...],
    conf: tuple[str, ...],
    source_format: str,
    source_options: tuple[str, ...],
    process: str,
    payload_cols: str | None,
    payload_col: str | None,
    external_key_col: str | None,
    tenant_col: str | None,
    priority: int | None,
    priority_col: str | None,
    run_at: dt.datetime | None,
    run_at_col: str | None,
    dedupe: bool,
) -> None:
    """Enqueue one task per row of SOURCE (a path Spark reads)."""

    def job() -> Any:
        from ..spark.enqueue import enqueue_dataframe
        from ..spark.progress import Progress
        from .progress import progress_bar

        database = _url(url, table)
        options = _pairs(source_options, "--option")
        with _session(master, jdbc_jars, conf, database, jdbc=False) as session:
            frame = session.read.format(source_format).options(**options).load(source)
            with progress_bar("enqueue") as bar, Progress(session, "enqueue", _echo, report=bar):
                return enqueue_dataframe(
                    frame,
                    database,
                    table,
                    process=process,
                    payload_cols=payload_cols.split(",") if payload_cols else None,
                    payload_col=payload_col,
                    external_key_col=external_key_col,
                    tenant_col=tenant_col,
                    priority=priority,
                    priority_col=priority_col,
                    run_at=run_at,
                    run_at_col=run_at_col,
                    dedupe=dedupe,
                )

    result = _run(job)
    click.echo(
        f"enqueued {result.enqueued:,} tasks into {table} from {result.rows:,} rows "
        f"({result.duplicates:,} duplicates skipped, {result.partitions} partitions)"
    )


@spark.command()
@_common_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output folder")
@click.option("--partitions", type=Number(SPARK_PARTITIONS), help="JDBC read partitions")
@click.option("--slowest", default=20, show_default=True, type=Number(SPARK_LISTED))
def report(
    url: str | None,
    table: str,
    master: str,
    jdbc_jars: tuple[str, ...],
    conf: tuple[str, ...],
    out: str,
    partitions: int | None,
    slowest: int,
) -> None:
    """Figures of the queue table per process, tenant and day: Parquet and report.md."""

    def job() -> Any:
        from ..spark.analytics import queue_report
        from ..spark.progress import Progress
        from .progress import progress_bar

        database = _url(url, table)
        with (
            _session(master, jdbc_jars, conf, database, jdbc=True) as session,
            progress_bar("report") as bar,
            Progress(session, "report", _echo, report=bar),
        ):
            return queue_report(
                session, database, table, out, partitions=partitions, slowest=slowest
            )

    result = _run(job)
    click.echo(f"read {result.rows:,} rows of {table}; report: {result.report}")


@spark.command()
@_common_options
@click.option("--path", required=True, help="the archive dataset (a folder, hdfs://, s3a://...)")
@click.option(
    "--retention-days",
    type=Number(RETENTION_DAYS),
    help=f"archive families older than this [default: {RETENTION_VARIABLE}]",
)
@click.option("--chunk-families", default=1000, show_default=True, type=Number(CHUNK_FAMILIES))
@click.option("--format", "file_format", default="parquet", show_default=True)
@click.option("--partitions", type=Number(SPARK_PARTITIONS), help="JDBC read partitions")
def archive(
    url: str | None,
    table: str,
    master: str,
    jdbc_jars: tuple[str, ...],
    conf: tuple[str, ...],
    path: str,
    retention_days: float | None,
    chunk_families: int,
    file_format: str,
    partitions: int | None,
) -> None:
    """Archive whole chains older than the retention to PATH, then delete them."""

    def job() -> Any:
        from ..spark.archive import archive_chains
        from ..spark.progress import Progress
        from .progress import progress_bar

        database = _url(url, table)
        retention = _retention(retention_days)
        with (
            _session(master, jdbc_jars, conf, database, jdbc=True) as session,
            progress_bar("archive") as bar,
            Progress(session, "archive", _echo, report=bar),
        ):
            return archive_chains(
                session,
                database,
                table,
                path,
                retention_days=retention,
                chunk_families=chunk_families,
                file_format=file_format,
                partitions=partitions,
            )

    result = _run(job)
    click.echo(
        f"archived {result.families:,} families ({result.rows:,} rows: {result.written:,} "
        f"written, {result.already_archived:,} already there) to {path}; deleted "
        f"{result.deleted:,} rows; {result.skipped_families:,} families changed meanwhile "
        "and were left"
    )


def _retention(days: float | None) -> float:
    if days is not None:
        return days
    raw = os.environ.get(RETENTION_VARIABLE)
    if raw is None:
        raise ConfigurationError(f"give --retention-days, or set {RETENTION_VARIABLE}")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{RETENTION_VARIABLE}={raw!r}: a number of days") from None
    if not RETENTION_DAYS.contains(value):
        raise ConfigurationError(f"{RETENTION_VARIABLE}={raw!r}: {RETENTION_DAYS.describe()}")
    return value
