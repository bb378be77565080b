"""The Spark tests' shared pieces: one SparkSession for the whole run, the
databases Spark reads through JDBC, and queue rows made to measure.

A SparkSession costs 8-30 s to start on a 2-core machine: every Spark test
shares this one (``local[2]``, 2 shuffle partitions, UI off), stopped when
the run ends.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, Table, insert

from tests.support.app import App, build

JDBC_DATABASES = ["postgresql", "mysql"]
# The tests' tables are small: compiling each query's generated code and
# re-planning it at every stage cost more than running it (the Spark tests
# took 128 s with both, 66 s without, on 2 cores). Neither changes a result.
SMALL_DATA = {"spark.sql.codegen.wholeStage": "false", "spark.sql.adaptive.enabled": "false"}
UTC = dt.timezone.utc


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        from sqla_queue.spark.session import jdbc_jars, spark_session
    except ImportError as exc:  # pragma: no cover - the test extra has PySpark
        if os.environ.get("SQLA_QUEUE_REQUIRE_DATABASES"):
            pytest.fail(f"PySpark is not installed: {exc}")
        pytest.skip(f"PySpark is not installed: {exc}")
    session = spark_session(
        "local[2]", app_name="sqla-queue tests", jars=jdbc_jars(JDBC_DATABASES), config=SMALL_DATA
    )
    yield session
    session.stop()


@pytest.fixture(params=JDBC_DATABASES)
def jdbc_url(request: pytest.FixtureRequest) -> str:
    """PostgreSQL and MariaDB: the databases Spark's JDBC source reads."""
    from sqla_queue.config.settings import normalize_url
    from tests.conftest import server_url

    return str(normalize_url(server_url(request.param)).render_as_string(hide_password=False))


@pytest.fixture
def jdbc_app(jdbc_url: str, table_name: str) -> Iterator[tuple[App, Engine]]:
    """A queue table on ``jdbc_url`` (dropped afterwards) and its engine."""
    from tests.conftest import created_engine

    app = build(table_name)
    with created_engine(jdbc_url, app.Base.metadata) as engine:
        yield app, engine


def add_chain(
    conn: Connection,
    table: Table,
    *,
    process: str,
    start: dt.datetime,
    attempts: Sequence[tuple[str, float | None, float | None]],
    tenant: int | None = None,
    dead: bool = False,
    live_id: int | None = None,
    exhausted: bool = False,
) -> list[int]:
    """Insert one chain, an attempt per (status, queue wait s, run time s)
    (None: not claimed / not ended), each due when the previous one ended;
    the last attempt is marked ``estouro_tentativas`` when ``exhausted``.
    Returns the rows' ids, first attempt first."""
    ids: list[int] = []
    due = start
    for number, (status, wait, run) in enumerate(attempts, start=1):
        started = None if wait is None else due + dt.timedelta(seconds=wait)
        finished = None if started is None or run is None else started + dt.timedelta(seconds=run)
        row = {
            "id_inicial": ids[0] if ids else None,
            "data_hora_inicial": start,
            "data_hora": due,
            "processo": process,
            "tentativa": number,
            "status": status,
            "tenant": tenant,
            "dead": dead,
            "live_id": live_id,
            "estouro_tentativas": exhausted and number == len(attempts),
            "payload": '{"n": 1}' if not ids else None,
            "started_at": started,
            "finished_at": finished,
            "pub_sub": False,
            "prioridade": 50,
        }
        ids.append(conn.execute(insert(table).returning(table.c.id), row).scalar_one())
        due = finished or due
    return ids
