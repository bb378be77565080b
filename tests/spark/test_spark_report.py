"""Queue analytics on Spark: the figures equal the same figures in SQL.

The table holds tasks run by a real worker (successes, retries, dead-letter
runs) and chains made to measure over three days, tenants and processes
(open ones, rescued ones, unclaimed ones). The SQL below is written apart
from the Spark code, from the definitions in docs/spark-report.md.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_queue.config.settings import Settings
from sqla_queue.spark import queue_report
from tests.support.app import App
from tests.support.spark_fixtures import add_chain

UTC = dt.timezone.utc
FIGURES = [
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
    "wait_p50",
    "wait_p95",
    "wait_p99",
    "run_p50",
    "run_p95",
    "run_p99",
    "throughput",
]

_SECONDS = {
    "postgresql": "EXTRACT(EPOCH FROM ({later} - {earlier}))",
    # 1e6, a DOUBLE: a DECIMAL divisor would round the quotient to 5 places
    "mysql": "TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1e6",
}
_DAY = {
    "postgresql": "CAST(COALESCE(data_hora_inicial, data_hora) AT TIME ZONE 'UTC' AS date)",
    "mysql": "DATE(COALESCE(data_hora_inicial, data_hora))",
}


def sql_figures(engine: Engine, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every figure per (process, tenant, day), in SQL."""
    dialect = "postgresql" if engine.dialect.name == "postgresql" else "mysql"
    seconds = _SECONDS[dialect]
    attempts = f"""
        SELECT t.*, COALESCE(id_inicial, id) AS chain, {_DAY[dialect]} AS day,
               {seconds.format(later="started_at", earlier="data_hora")} AS wait,
               CASE WHEN started_at IS NOT NULL
                    THEN {seconds.format(later="finished_at", earlier="started_at")} END AS run
        FROM {table} t"""
    counts = f"""
        SELECT processo, tenant, day,
          COUNT(DISTINCT CASE WHEN NOT dead THEN chain END) AS tasks,
          COUNT(CASE WHEN NOT dead THEN 1 END) AS attempts,
          COUNT(DISTINCT CASE WHEN NOT dead AND status = 'sucesso' THEN chain END) AS succeeded,
          COUNT(CASE WHEN NOT dead AND status IN ('falha', 'falha_processando') THEN 1 END)
            AS failed_attempts,
          COUNT(DISTINCT CASE WHEN NOT dead AND estouro_tentativas THEN chain END)
            AS dead_lettered,
          COUNT(DISTINCT CASE WHEN NOT dead AND status IN ('agendada', 'pendente', 'processando')
            THEN chain END) AS open,
          COUNT(DISTINCT CASE WHEN dead THEN chain END) AS dead_runs,
          COUNT(DISTINCT CASE WHEN dead AND status = 'sucesso' THEN chain END)
            AS dead_runs_succeeded,
          COUNT(CASE WHEN status = 'sucesso' THEN 1 END) AS successes,
          {seconds.format(later="MAX(finished_at)", earlier="MIN(started_at)")} AS span
        FROM ({attempts}) a GROUP BY processo, tenant, day"""
    percentiles = {
        f"{kind}_p{round(p * 100)}": p for kind in ("wait", "run") for p in (0.5, 0.95, 0.99)
    }
    if dialect == "postgresql":
        listed = ", ".join(
            f"percentile_cont({p}) WITHIN GROUP (ORDER BY {name[:-4]}) AS {name}"
            for name, p in percentiles.items()
        )
        spread = f"SELECT processo, tenant, day, {listed} FROM ({attempts}) a GROUP BY 1, 2, 3"
    else:  # MariaDB has PERCENTILE_CONT as a window function only
        windows = ", ".join(
            f"PERCENTILE_CONT({p}) WITHIN GROUP (ORDER BY {name[:-4]}) "
            f"OVER (PARTITION BY processo, tenant, day) AS {name}"
            for name, p in percentiles.items()
        )
        maxima = ", ".join(f"MAX({name}) AS {name}" for name in percentiles)
        spread = (
            f"SELECT processo, tenant, day, {maxima} FROM "
            f"(SELECT processo, tenant, day, {windows} FROM ({attempts}) a) w "
            "GROUP BY processo, tenant, day"
        )
    with engine.connect() as conn:
        by_key = {
            (r.processo, r.tenant, r.day): dict(r._mapping) for r in conn.execute(text(counts))
        }
        for r in conn.execute(text(spread)):
            by_key[(r.processo, r.tenant, r.day)].update(
                {name: r._mapping[name] for name in percentiles}
            )
    for row in by_key.values():
        tasks, attempts_ = row["tasks"], row["attempts"]
        row["success_rate"] = row["succeeded"] / tasks if tasks else None
        row["failure_rate"] = row["failed_attempts"] / attempts_ if attempts_ else None
        row["dead_letter_rate"] = row["dead_lettered"] / tasks if tasks else None
        row["retries_per_task"] = (attempts_ - tasks) / tasks if tasks else None
        span = row["span"]
        row["throughput"] = row["successes"] / float(span) if span else None
    return by_key


def _same(a: Any, b: Any) -> bool:
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b)]
    if any(missing):
        return all(missing)
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-6)


def _fill(engine: Engine, app: App, now: dt.datetime) -> None:
    """Tasks run by a real worker today, and chains made to measure."""

    class Worker(app.RecordingWorker):
        max_retry = 2

    with Session(engine) as session, session.begin():
        session.add_all(
            app.Task(process="faturar", tenant=1, payload={"fail": "x"} if i % 4 == 0 else {"i": i})
            for i in range(12)
        )
    assert Worker().run(engine=engine, burst=True, settings=Settings()) == 0
    table = app.Task.__table__
    with engine.begin() as conn:
        for day in (1, 2, 3):
            # 10:00 UTC: the chains of a day (and their dead-letter runs) stay on it
            start = (now - dt.timedelta(days=day)).replace(hour=10, minute=0, second=0)
            for i in range(6):
                add_chain(
                    conn,
                    table,
                    process="enviar",
                    tenant=None if i % 3 == 0 else i % 3,
                    start=start + dt.timedelta(minutes=i),
                    attempts=[("falha", 0.5 * i, 2.0), ("sucesso", 1.5 + i, 0.25 * day)][
                        : 1 + (i % 2)
                    ],
                    exhausted=i % 2 == 0,
                )
            live = add_chain(
                conn, table, process="enviar", tenant=2, start=start, attempts=[("falha", 1, 1)]
            )
            add_chain(
                conn,
                table,
                process="enviar",
                tenant=2,
                start=start + dt.timedelta(hours=1),
                attempts=[("falha_processando", 3, 30), ("sucesso", 0.1, 0.2)],
                dead=True,
                live_id=live[0],
            )
            add_chain(
                conn,
                table,
                process="cobrar",
                start=start,
                attempts=[("falha_processando", 2, 60), ("processando", 4, None)],
            )
            add_chain(
                conn, table, process="cobrar", start=start, attempts=[("pendente", None, None)]
            )


def test_figures_equal_the_same_figures_computed_in_sql(
    spark: Any, jdbc_app: tuple[App, Engine], installed: None, tmp_path: Path
) -> None:
    app, engine = jdbc_app
    now = dt.datetime.now(UTC)
    _fill(engine, app, now)

    result = queue_report(spark, engine.url, app.Task, tmp_path / "report", slowest=5)

    import pandas as pd

    figures = pd.read_parquet(result.figures)
    expected = sql_figures(engine, app.Task.__table__.name)
    # faturar today; on each of 3 days, enviar for 3 tenants and cobrar
    assert len(figures) == len(expected) == 1 + 3 * 4
    for _, row in figures.iterrows():
        tenant = None if pd.isna(row["tenant"]) else int(row["tenant"])
        want = expected[(row["processo"], tenant, row["day"])]
        for name in FIGURES:
            assert _same(row[name], want[name]), (row["processo"], tenant, row["day"], name)
    faturar = expected[("faturar", 1, now.date())]
    assert (faturar["tasks"], faturar["dead_lettered"], faturar["dead_runs"]) == (12, 3, 3)

    with engine.connect() as conn:
        count = text(f"SELECT COUNT(*) FROM {app.Task.__table__.name}")
        assert result.rows == conn.execute(count).scalar_one()
    slowest = pd.read_parquet(result.slowest_chains)
    assert len(slowest) == 5
    assert list(slowest["duration"]) == sorted(slowest["duration"], reverse=True)
    report = result.report.read_text()
    for picture in ("tasks_per_day.png", "outcomes_per_day.png", "latency_per_day.png"):
        assert f"]({picture})" in report
        assert (result.report.parent / picture).stat().st_size > 5000
    assert "| faturar |" in report and "## Slowest chains" in report
