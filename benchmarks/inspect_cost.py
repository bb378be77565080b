"""What ``sqla-queue status`` (sqla_queue.ops.status) costs on a big table.

    .venv/bin/python benchmarks/inspect_cost.py [--rows 5000000] [--db postgresql|mysql|sqlite]

Fills a fresh queue table with ROWS finished attempts (90% first-attempt
successes, 5% failed attempts with their retry, 1% dead-letter runs), plus
1,000 ready and 50 running tasks, then times (median of 5) each part of a
status (the first ``queue_status`` ever, which counts every finished
attempt; a new process's, which reads the counts kept in ``<table>_status``
and counts only the ranges of ids that may have changed; the calls after
it in one process: status_summary.py; one without its lists of running
tasks and newest failures), one ``task_timeline`` and the dead letter's
first page. The table is analysed once (VACUUM ANALYZE on
PostgreSQL, ANALYZE elsewhere) before timing; the plan tests check the
open-state statements without statistics.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqla_queue import QueueMixin
from sqla_queue.common.types import utcnow
from sqla_queue.ops.status import dead_letter, queue_status, task_timeline
from sqla_queue.ops.status_counts import forget_all, status_table

URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
    "sqlite": "sqlite:////tmp/inspect_cost.db",
}
TABLE = "fila_inspect_cost"


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE


def fill(engine: Any, rows: int) -> None:
    """ROWS finished attempts in one statement per kind, numbered by n."""
    family = engine.dialect.name
    if family == "postgresql":
        numbers = "generate_series(1, {n}) AS g(n)"
        now = "clock_timestamp()"
    elif family in ("mysql", "mariadb"):
        numbers = "seq_1_to_{n} AS g"
        now = "UTC_TIMESTAMP(6)"
    else:
        numbers = (
            "(WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {n}) "
            "SELECT n FROM c) AS g"
        )
        now = "strftime('%Y-%m-%d %H:%M:%f000', 'now')"
    seq = "g.seq" if family in ("mysql", "mariadb") else "g.n"
    done = int(rows * 0.9)
    failed = int(rows * 0.05)
    dead = int(rows * 0.01)
    statements = [
        # successes
        f"INSERT INTO {TABLE} (processo, status, tentativa, payload, finished_at, started_at) "
        f"SELECT CASE WHEN {seq} % 3 = 0 THEN 'notificar' ELSE 'faturar' END, 'sucesso', 1, "
        f"'{{\"n\": 1}}', {now}, {now} FROM {numbers.format(n=done)}",
        # failed first attempts, marked requeued
        f"INSERT INTO {TABLE} (processo, status, tentativa, reenfileirado, mensagem, finished_at) "
        f"SELECT 'faturar', 'falha', 1, true, 'ValueError: boom. Tarefa reenfileirada.', {now} "
        f"FROM {numbers.format(n=failed)}",
        # dead-letter runs
        f"INSERT INTO {TABLE} (processo, status, tentativa, dead, live_id, finished_at) "
        f"SELECT 'faturar', 'sucesso', 1, true, {seq}, {now} FROM {numbers.format(n=dead)}",
        # open: ready and running
        f"INSERT INTO {TABLE} (processo, status, tentativa) "
        f"SELECT 'faturar', 'pendente', 1 FROM {numbers.format(n=1000)}",
        f"INSERT INTO {TABLE} (processo, status, tentativa, worker_id, started_at) "
        f"SELECT 'faturar', 'processando', 1, 'bench:1:x', {now} FROM {numbers.format(n=50)}",
    ]
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
        # the failed attempts' retries, succeeded
        conn.execute(
            text(
                f"INSERT INTO {TABLE} (processo, status, tentativa, id_inicial, finished_at) "
                f"SELECT 'faturar', 'sucesso', 2, id, finished_at FROM {TABLE} "
                "WHERE status = 'falha'"
            )
        )
    if family == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {TABLE}"))
    else:
        with engine.begin() as conn:
            conn.execute(text(f"ANALYZE {'TABLE ' if family != 'sqlite' else ''}{TABLE}"))


def timed(call: Callable[[], Any], repeat: int = 5) -> float:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--db", choices=sorted(URLS), default="postgresql")
    args = parser.parse_args()
    engine = create_engine(URLS[args.db])
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    started = time.perf_counter()
    fill(engine, args.rows)
    with engine.connect() as conn:
        total = conn.execute(text(f"SELECT count(*) FROM {TABLE}")).scalar_one()
    print(f"{args.db}: {total:,} rows filled in {time.perf_counter() - started:.0f} s")
    with engine.connect() as conn:
        some_failed = conn.execute(
            text(f"SELECT max(id) FROM {TABLE} WHERE status = 'falha'")
        ).scalar_one()
    # the fill finishes every row now; a real table's rows finished over
    # days, mostly before the throughput window (5 minutes): the status is
    # asked 10 minutes later, whose window holds none of them
    later = utcnow() + dt.timedelta(minutes=10)
    kept = status_table(Task.__table__)

    def first_ever() -> Any:
        with engine.begin() as conn:
            conn.execute(kept.delete())
        forget_all()
        return queue_status(engine, Task, now=later)

    parts: dict[str, Callable[[], Any]] = {
        # nothing counted yet, anywhere: every range
        "queue_status, first ever": first_ever,
        # a new process (a one-shot `sqla-queue status`): the counts kept in
        # <table>_status, the ranges that may have changed
        "queue_status, new process": lambda: (forget_all(), queue_status(engine, Task, now=later)),
        "queue_status, exact=True": lambda: queue_status(engine, Task, now=later, exact=True),
        # the calls after it (the dashboard, --watch): the ranges that may
        # have changed (status_summary.py)
        "queue_status": lambda: queue_status(engine, Task, now=later),
        "queue_status, no rows lists": lambda: queue_status(
            engine, Task, now=later, running=0, failures=0
        ),
        "queue_status, window on every row": lambda: queue_status(engine, Task),
        "task_timeline": lambda: task_timeline(engine, Task, some_failed),
        "dead_letter (50)": lambda: dead_letter(engine, Task, limit=50),
    }
    for name, call in parts.items():
        print(f"  {name:<30} {timed(call) * 1000:10.1f} ms")
    Base.metadata.drop_all(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
