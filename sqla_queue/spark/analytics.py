"""Queue analytics: a queue table's figures per process, tenant and day.

The job reads every row of the table (every attempt, of live chains and of
dead-letter runs) through Spark's JDBC source, split on ``id``, without the
payload. Each row belongs to a **chain** (``coalesce(id_inicial, id)``: a
task's first attempt and its retries) and to the **day** its chain started
(the UTC date of ``data_hora_inicial``). A dead-letter run (``dead``) is a
chain of its own, counted apart. Per (process, tenant, day):

=====================  ===========================================================
``tasks``              live chains (``dead`` false)
``attempts``           rows of live chains
``succeeded``          live chains with a ``sucesso`` attempt
``failed_attempts``    attempts of live chains in ``falha`` or ``falha_processando``
``dead_lettered``      live chains that exhausted their attempts (``estouro_tentativas``)
``open``               live chains with an attempt still ``agendada``, ``pendente``
                       or ``processando``
``dead_runs``          dead-letter chains; ``dead_runs_succeeded`` those that succeeded
``success_rate``       succeeded / tasks; ``dead_letter_rate`` dead_lettered / tasks
``failure_rate``       failed_attempts / attempts
``retries_per_task``   (attempts - tasks) / tasks
``wait_p50/p95/p99``   seconds from due (``data_hora``) to claim (``started_at``), over
                       every claimed attempt, live and dead
``run_p50/p95/p99``    seconds from claim to end (``finished_at``), same attempts
``throughput``         ``sucesso`` attempts per second between the group's first
                       claim and its last end
=====================  ===========================================================

Percentiles are exact, interpolated between the two nearest values (Spark's
``percentile``, SQL's ``percentile_cont``), so the same figures computed in
SQL on the same table are equal; a test checks it. The slowest chains are
closed live chains (every attempt ended) by the time from their first due
time to their last end. ``started_at`` and ``finished_at`` are sqla-queue's
own columns: attempts run by nsj-queue-lib workers lack them and count in
every figure but the times.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table
from sqlalchemy.engine import URL

from ..client.queue import resolve_table
from ..schema.mixins import OPEN_STATUSES, QueueMixin, Status
from .jdbc import read_queue

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FIGURES", "ReportResult", "queue_figures", "queue_report"]

READ_COLUMNS = (
    "id",
    "id_inicial",
    "data_hora_inicial",
    "data_hora",
    "processo",
    "tenant",
    "status",
    "dead",
    "estouro_tentativas",
    "started_at",
    "finished_at",
)
PERCENTILES = (0.5, 0.95, 0.99)
SLOWEST_CHAINS = 20
FAILED_STATUSES = (Status.FAILED.value, Status.FAILED_PROCESSING.value)
#: the figures' columns, after the grouping keys
FIGURES = (
    "tasks",
    "attempts",
    "succeeded",
    "failed_attempts",
    "dead_lettered",
    "open",
    "dead_runs",
    "dead_runs_succeeded",
    "success_rate",
    "failure_rate",
    "dead_letter_rate",
    "retries_per_task",
    *(f"{kind}_p{round(p * 100)}" for kind in ("wait", "run") for p in PERCENTILES),
    "throughput",
)
GROUPS = ("processo", "tenant", "day")


@dataclass(frozen=True)
class ReportResult:
    """Where one run of :func:`queue_report` wrote what."""

    rows: int  # rows of the queue table read
    figures: Path  # Parquet: per process, tenant and day
    by_day: Path  # Parquet: per day, every process and tenant
    slowest_chains: Path  # Parquet
    report: Path  # Markdown, with PNG plots beside it


def _seconds(later: Column, earlier: Column) -> Column:
    from pyspark.sql import functions as F

    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1_000_000.0)


def attempts(frame: DataFrame) -> DataFrame:
    """The table's rows with their chain, day, queue wait and run time."""
    from pyspark.sql import functions as F

    return frame.select(
        "id",
        "data_hora",
        "processo",
        "tenant",
        "status",
        "started_at",
        "finished_at",
        # MariaDB's BOOL is TINYINT(1): a number to Spark
        F.coalesce(F.col("dead").cast("boolean"), F.lit(False)).alias("dead"),
        F.coalesce(F.col("estouro_tentativas").cast("boolean"), F.lit(False)).alias(
            "estouro_tentativas"
        ),
        F.coalesce("id_inicial", "id").alias("chain"),
        F.to_date(F.coalesce("data_hora_inicial", "data_hora")).alias("day"),
        _seconds(F.col("started_at"), F.col("data_hora")).alias("wait"),
        F.when(F.col("started_at").isNotNull(), _seconds(F.col("finished_at"), F.col("started_at")))
        .alias("run"),
    )  # fmt: skip


def _ratio(numerator: Column, denominator: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(denominator > 0, numerator / denominator)


def figures(rows: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """The figures of :data:`FIGURES` per ``keys`` over :func:`attempts` rows."""
    from pyspark.sql import functions as F

    live = ~F.col("dead")
    live_chain = F.when(live, F.col("chain"))

    def chains(condition: Column) -> Column:
        return F.count_distinct(F.when(condition, F.col("chain")))

    def rows_where(condition: Column) -> Column:
        return F.count(F.when(condition, F.lit(1)))

    aggregates = [
        F.count_distinct(live_chain).alias("tasks"),
        rows_where(live).alias("attempts"),
        chains(live & (F.col("status") == Status.SUCCEEDED.value)).alias("succeeded"),
        rows_where(live & F.col("status").isin(*FAILED_STATUSES)).alias("failed_attempts"),
        chains(live & F.col("estouro_tentativas")).alias("dead_lettered"),
        chains(live & F.col("status").isin(*OPEN_STATUSES)).alias("open"),
        chains(F.col("dead")).alias("dead_runs"),
        chains(F.col("dead") & (F.col("status") == Status.SUCCEEDED.value)).alias(
            "dead_runs_succeeded"
        ),
    ]
    for kind in ("wait", "run"):
        for p in PERCENTILES:
            aggregates.append(F.percentile(kind, F.lit(p)).alias(f"{kind}_p{round(p * 100)}"))
    aggregates += [
        rows_where(F.col("status") == Status.SUCCEEDED.value).alias("_successes"),
        F.min("started_at").alias("_first_claim"),
        F.max("finished_at").alias("_last_end"),
    ]
    grouped = rows.groupBy(*keys).agg(*aggregates)
    tasks, attempts_ = F.col("tasks"), F.col("attempts")
    span = _seconds(F.col("_last_end"), F.col("_first_claim"))
    return grouped.select(
        *keys,
        *(F.col(name) for name in FIGURES[:8]),
        _ratio(F.col("succeeded"), tasks).alias("success_rate"),
        _ratio(F.col("failed_attempts"), attempts_).alias("failure_rate"),
        _ratio(F.col("dead_lettered"), tasks).alias("dead_letter_rate"),
        _ratio(attempts_ - tasks, tasks).alias("retries_per_task"),
        *(F.col(name) for name in FIGURES[12:-1]),
        _ratio(F.col("_successes"), span).alias("throughput"),
    ).orderBy(*keys)


def slowest_chains(rows: DataFrame, limit: int = SLOWEST_CHAINS) -> DataFrame:
    """Closed live chains, slowest first: first due time to last end."""
    from pyspark.sql import functions as F

    chains = (
        rows.where(~F.col("dead"))
        .groupBy("chain")
        .agg(
            F.first("processo").alias("processo"),
            F.first("tenant").alias("tenant"),
            F.count(F.lit(1)).alias("attempts"),
            F.max_by("status", "id").alias("status"),
            F.min("data_hora").alias("first_due"),
            F.max("finished_at").alias("last_end"),
            F.count(F.when(F.col("finished_at").isNull(), F.lit(1))).alias("_unfinished"),
        )
        .where(F.col("_unfinished") == 0)
    )
    return (
        chains.select(
            "chain",
            "processo",
            "tenant",
            "attempts",
            "status",
            "first_due",
            "last_end",
            _seconds(F.col("last_end"), F.col("first_due")).alias("duration"),
        )
        .orderBy(F.col("duration").desc(), "chain")
        .limit(limit)
    )


def queue_figures(
    spark: SparkSession,
    url: str | URL,
    model_or_table: str | type[QueueMixin] | Table,
    *,
    partitions: int | None = None,
) -> DataFrame:
    """The table's rows as :func:`attempts` (cached: several jobs read them)."""
    table = resolve_table(model_or_table)
    frame = read_queue(spark, url, table, columns=READ_COLUMNS, partitions=partitions)
    return attempts(frame).cache()


def queue_report(
    spark: SparkSession,
    url: str | URL,
    model_or_table: str | type[QueueMixin] | Table,
    out: str | Path,
    *,
    partitions: int | None = None,
    slowest: int = SLOWEST_CHAINS,
) -> ReportResult:
    """Read the queue table, write its figures to ``out`` as Parquet
    (``figures``, ``by_day``, ``slowest_chains``) and ``report.md`` with
    PNG plots. ``out`` is a local folder (the report is read by a person);
    the Parquet files could go anywhere Spark writes."""
    from .render import render_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = queue_figures(spark, url, model_or_table, partitions=partitions)
    try:
        count = rows.count()
        outputs: dict[str, Any] = {
            "figures": figures(rows, GROUPS),
            "by_day": figures(rows, ("day",)),
            "by_process": figures(rows, ("processo",)),
            "slowest_chains": slowest_chains(rows, slowest),
        }
        local: dict[str, Any] = {}
        for name, frame in outputs.items():
            if name != "by_process":
                frame.coalesce(1).write.mode("overwrite").parquet(str(out / f"{name}.parquet"))
            local[name] = frame.toPandas() if name != "figures" else None
        local["figures"] = spark.read.parquet(str(out / "figures.parquet")).toPandas()
    finally:
        rows.unpersist()
    table = resolve_table(model_or_table)
    report = render_report(out, table_name=table.name, rows=count, **local)
    return ReportResult(
        rows=count,
        figures=out / "figures.parquet",
        by_day=out / "by_day.parquet",
        slowest_chains=out / "slowest_chains.parquet",
        report=report,
    )
