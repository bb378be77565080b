"""``sqla-queue spark enqueue|report|archive``: the commands through click's
runner on the shared session, and in real subprocesses the one-line errors
that come before any JVM starts."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select

from sqla_queue.cli import main
from tests.conftest import run_cli
from tests.support.app import App
from tests.support.spark_fixtures import SMALL_DATA, add_chain


def _count(engine: Engine, app: App, **where: Any) -> int:
    with engine.connect() as conn:
        statement = select(func.count()).select_from(app.Task)
        for column, value in where.items():
            statement = statement.where(getattr(app.Task, column) == value)
        return int(conn.execute(statement).scalar_one())


@pytest.mark.parametrize("jdbc_url", ["postgresql"], indirect=True)
def test_enqueue_command(spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path) -> None:
    # through click's runner on the shared session: a subprocess would start
    # a JVM of its own (30 s on this machine); the subprocess tests below
    # cover what happens before Spark starts
    app, engine = jdbc_app
    source = tmp_path / "invoices.parquet"
    spark.range(1000).selectExpr("id", "concat('n', id) AS number").write.parquet(str(source))
    url = engine.url.render_as_string(hide_password=False)

    done = CliRunner().invoke(
        main,
        ["spark", "enqueue", str(source), "--url", url, "--table", app.Task.__table__.name,
         "--process", "faturar", "--external-key-col", "number", "--dedupe"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert (
        done.stdout.strip()
        .splitlines()[-1]
        .startswith(
            f"enqueued 1,000 tasks into {app.Task.__table__.name} from 1,000 rows "
            "(0 duplicates skipped, "
        )
    )
    assert _count(engine, app, process="faturar") == 1000


@pytest.mark.parametrize("jdbc_url", ["mysql"], indirect=True)
def test_report_and_archive_commands(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path
) -> None:
    app, engine = jdbc_app
    table = app.Task.__table__
    start = dt.datetime(2026, 1, 5, 10, tzinfo=dt.timezone.utc)
    with engine.begin() as conn:
        for i in range(30):
            add_chain(conn, table, process="enviar", tenant=i % 3, start=start,
                      attempts=[("sucesso", 1.0, 2.0)])  # fmt: skip
    url = engine.url.render_as_string(hide_password=False)
    runner = CliRunner()

    reported = runner.invoke(
        main, ["spark", "report", "--url", url, "--table", table.name, "--out", str(tmp_path / "r")]
    )
    assert reported.exit_code == 0, reported.output
    assert f"read 30 rows of {table.name}; report: " in reported.stdout
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| enviar | 30 | 30 | 100.0% | 0.0% | 0.0% | 0.0 | 0 | 1.0 s / 1.0 s / 1.0 s |" in report

    archived = runner.invoke(
        main,
        ["spark", "archive", "--url", url, "--table", table.name, "--path", str(tmp_path / "a"),
         "--chunk-families", "7"],
        env={"QUEUE_PURGE_MAX_AGE": "1"},
    )  # fmt: skip
    assert archived.exit_code == 0, archived.output
    assert "archived 30 families (30 rows: 30 written, 0 already there)" in archived.stdout
    assert "deleted 30 rows" in archived.stdout
    assert _count(engine, app) == 0


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["report", "--out", "OUT", "--jdbc-jar", "/no/such/driver.jar"],
            {},
            "Error: JDBC driver jar not found: /no/such/driver.jar",
        ),
        (
            ["report", "--out", "OUT"],
            {"JAVA_HOME": "/no/such/java"},
            "Error: Java not found: JAVA_HOME=/no/such/java has no bin/java (install a Java 17+ "
            "runtime, Debian: apt-get install openjdk-17-jre-headless)",
        ),
        (
            ["archive", "--path", "OUT"],
            {"QUEUE_PURGE_MAX_AGE": "soon"},
            "Error: QUEUE_PURGE_MAX_AGE='soon': a number of days",
        ),
        (
            ["enqueue", "OUT", "--process", "p", "--conf", "novalue"],
            {},
            "Error: Invalid value for --conf: 'novalue': give KEY=VALUE",
        ),
        (
            ["report", "--out", "OUT", "--table", "bad-name"],
            {},
            "Error: invalid table name 'bad-name': use letters, digits and underscores, "
            "not starting with a digit",
        ),
    ],
    ids=["missing-jar", "missing-java", "bad-retention", "bad-conf", "bad-table"],
)
def test_bad_input_is_one_line_before_spark_starts(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    args = [str(tmp_path) if a == "OUT" else a for a in args]
    if "--table" not in args:
        args += ["--table", "fila"]
    done = run_cli(
        "spark", *args, "--url", "postgresql://postgres@127.0.0.1/test", env=env, check=False
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in done.stderr


def test_missing_jar_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqla_queue.common.exceptions import SparkSetupError
    from sqla_queue.spark import session

    monkeypatch.setattr(session.JDBC_DRIVERS["mysql"], "jar", Path("/nowhere/mariadb.jar"))
    with pytest.raises(SparkSetupError) as error:
        session.jdbc_jars(["mysql"], env={})
    assert str(error.value) == (
        "the MariaDB/MySQL JDBC driver jar is missing: /nowhere/mariadb.jar (Debian: apt-get "
        "install libmariadb-java; or give its path with --jdbc-jar or SQLA_QUEUE_SPARK_JARS)"
    )
    with pytest.raises(SparkSetupError, match="Java not found: Spark needs a Java 17"):
        session.find_java({"PATH": "/nowhere"})


def test_progress_reports_a_running_stage(spark: Any) -> None:
    import pyarrow as pa

    from sqla_queue.spark.progress import Progress

    def slow(batches: Any) -> Any:
        for batch in batches:
            time.sleep(0.5)  # the task's own work, long enough to be seen running
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows]})

    lines: list[str] = []
    with Progress(spark, "test", lines.append, interval=0.05):
        spark.range(4).repartition(2).mapInArrow(slow, "n long").collect()
    assert any(
        re.fullmatch(r"test: stage \d+: [0-2]/2 tasks done, [0-2] running", line) for line in lines
    )


def test_progress_tells_a_report_instead_of_printing(spark: Any) -> None:
    """On a terminal the commands draw a bar from these reports (the
    maintenance test checks the bar on a real pseudo-terminal)."""
    import pyarrow as pa

    from sqla_queue.spark.progress import Progress

    def slow(batches: Any) -> Any:
        for batch in batches:
            time.sleep(0.5)
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows]})

    lines: list[str] = []
    reports: list[tuple[int, int | None, str]] = []
    with Progress(spark, "test", lines.append, interval=0.05, report=lambda *r: reports.append(r)):
        spark.range(4).repartition(2).mapInArrow(slow, "n long").collect()
    assert lines == [] and reports
    for done, total, note in reports:
        assert total is not None and 0 <= done <= total
        assert re.fullmatch(r"Spark tasks, \d+ stage\(s\)", note)


SESSION_FROM_PYTHON = """
import json
import sys

from sqla_queue.spark import queue_report, spark_session

url, table, out, config = sys.argv[1:]
session = spark_session("local[1]", config=json.loads(config))
print(queue_report(session, url, table, out).rows)
session.stop()
"""


@pytest.mark.timeout(300)  # a JVM of its own: 61 s on a quiet machine, over 120 under load
@pytest.mark.parametrize("jdbc_url", ["mysql"], indirect=True)
def test_spark_session_from_python_adds_the_installed_jdbc_jars(
    jdbc_app: tuple[App, Engine], tmp_path: Path
) -> None:
    """docs/spark-report.md's Python entry point, given no jars: Debian's
    MariaDB driver is on the session as the command puts it (it was not,
    and the read failed in a long Java trace). A JVM of its own: a subprocess."""
    app, engine = jdbc_app
    with engine.begin() as conn:
        add_chain(
            conn,
            app.Task.__table__,
            process="p",
            start=dt.datetime(2026, 3, 1, 10, tzinfo=dt.timezone.utc),
            attempts=[("sucesso", 1.0, 2.0)],
        )
    url = engine.url.render_as_string(hide_password=False)
    # the shared session's settings for small tables: no code generated for
    # each of the report's stages
    config = json.dumps(SMALL_DATA)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            SESSION_FROM_PYTHON,
            url,
            app.Task.__table__.name,
            str(tmp_path),
            config,
        ],
        env={key: value for key, value in os.environ.items() if key != "SQLA_QUEUE_SPARK_JARS"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.split() == ["1"]


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--out", "OUT"],
        ["archive", "--path", "OUT", "--retention-days", "30"],
        ["enqueue", "OUT", "--process", "p"],
    ],
    ids=["report", "archive", "enqueue"],
)
def test_without_pyspark_each_command_is_the_extra_hint_in_one_line(
    tmp_path: Path, args: list[str]
) -> None:
    """PySpark made unimportable, as if the spark extra were not installed."""
    from tests.acceptance.test_packaging import run_cli_without

    args = [str(tmp_path) if arg == "OUT" else arg for arg in args]
    url = "postgresql://u@127.0.0.1:1/db"  # never reached
    done = run_cli_without("pyspark,py4j", "spark", *args, "--url", url, "--table", "fila")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: PySpark is not installed: pip install 'sqla-queue[spark]'"
    ]
