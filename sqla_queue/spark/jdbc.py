"""A queue table as a Spark DataFrame, through Spark's JDBC source.

The SQLAlchemy URL the rest of sqla-queue takes becomes a JDBC URL and its
properties here. The user and the password go into the properties, never
into the URL, which Spark logs and shows in its plans.

Traps (measured, see docs/spark.md): MariaDB is reached with a
``jdbc:mysql://`` URL and the MariaDB driver class, since Spark picks its
MySQL dialect (backtick quoting) by that prefix only; with ``jdbc:mariadb://``
it quotes column names with double quotes, which MariaDB reads as strings.
Reads are split on ``id`` into ranges read in parallel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, create_engine
from sqlalchemy.engine import URL

from ..adapters import adapter_of
from ..common.exceptions import SparkSetupError
from ..common.types import dialect_family
from ..config.settings import normalize_url
from .session import JDBC_DRIVERS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["JdbcSource", "read_queue"]


@dataclass(frozen=True)
class JdbcSource:
    """One database, as Spark's JDBC source wants it."""

    family: str
    url: str
    properties: Mapping[str, str] = field(repr=False)

    @classmethod
    def from_url(cls, url: str | URL, options: Mapping[str, str] | None = None) -> JdbcSource:
        """From a SQLAlchemy URL (PostgreSQL, MariaDB/MySQL); ``options``
        are extra JDBC connection properties."""
        parsed = normalize_url(url)
        family = dialect_family(parsed.get_backend_name())
        driver = JDBC_DRIVERS.get(family)
        if driver is None:
            raise SparkSetupError(
                f"the Spark jobs read PostgreSQL and MariaDB/MySQL through JDBC, not {family}"
            )
        host = parsed.host or "localhost"
        scheme = "postgresql" if family == "postgresql" else "mysql"
        port = f":{parsed.port}" if parsed.port else ""
        jdbc_url = f"jdbc:{scheme}://{host}{port}/{parsed.database or ''}"
        properties = {"driver": driver.class_name}
        if family == "postgresql":
            # strings bound to jsonb/json columns, and batched INSERTs rewritten
            properties.update(stringtype="unspecified", reWriteBatchedInserts="true")
        else:
            properties.update(rewriteBatchedStatements="true")
        if parsed.username:
            properties["user"] = parsed.username
        if parsed.password:
            properties["password"] = str(parsed.password)
        properties.update(options or {})
        return cls(family, jdbc_url, properties)

    def quote(self, table: Table) -> str:
        """``table``'s qualified name as this database quotes it."""
        mark = '"' if self.family == "postgresql" else "`"
        parts = [table.schema, table.name] if table.schema else [table.name]
        # names are validated identifiers (split_table_name): no mark inside
        return ".".join(f"{mark}{part}{mark}" for part in parts)


def id_bounds(url: str | URL, table: Table) -> tuple[int, int] | None:
    """The smallest and largest id in ``table``, None when it is empty."""
    engine = create_engine(normalize_url(url))
    try:
        queries = adapter_of(engine.dialect, table).inspection
        with engine.connect() as conn:
            low, high = queries.id_bounds(conn)
    finally:
        engine.dispose()
    return None if low is None or high is None else (int(low), int(high))


def read_queue(
    spark: SparkSession,
    url: str | URL,
    table: Table,
    *,
    columns: Sequence[str] | None = None,
    partitions: int | None = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every row of the queue ``table`` (all attempts, live and dead
    chains), read in ``partitions`` ranges of ``id`` (default: the
    session's parallelism). ``columns`` limits what is read."""
    source = JdbcSource.from_url(url, options)
    bounds = id_bounds(url, table)
    reader: Any = spark.read.option("fetchsize", "10000")
    if bounds is None:
        frame = reader.jdbc(source.url, source.quote(table), properties=dict(source.properties))
    else:
        frame = reader.jdbc(
            source.url,
            source.quote(table),
            column="id",
            lowerBound=bounds[0],
            upperBound=bounds[1] + 1,
            numPartitions=partitions or spark.sparkContext.defaultParallelism,
            properties=dict(source.properties),
        )
    selected: DataFrame = frame.select(*columns) if columns else frame
    return selected
