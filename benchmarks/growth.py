"""(e) Cost growth and idle cost, PostgreSQL.

1. Claim/processing rate on an empty table and on one with N finished rows
   (default 5,000,000 'sucesso' attempts, as the seed keeps every attempt):
   20,000 pending no-op tasks are processed by one in-process burst worker,
   --reps times on each table, the two tables in turns (so that the
   server's drift, such as the checkpointer writing the fill, falls on
   both alike), and the medians compared.
2. An idle worker started through the real CLI: RSS and CPU over 30 s.

    .venv/bin/python benchmarks/growth.py [--finished 5000000] [--reps 5] [--steady]

Writes benchmarks/results/growth.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import QueueMixin, WorkerBase, normalize_url

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TABLE = "bench_growth"
EMPTY_TABLE = "bench_growth_empty"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE


class Noop(WorkerBase):
    model = Task

    def execute(self, payload: Any, task: Any, session: Any) -> None:
        return None


class EmptyTask(QueueMixin, Base):
    """The empty table, measured in turns with the full one (the same
    machine state: WAL, caches, the checkpointer's backlog)."""

    __tablename__ = EMPTY_TABLE


class EmptyNoop(Noop):
    model = EmptyTask


def _preload(engine: Any, n: int, status: str, process: str, table: str = TABLE) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {table} (processo, payload, payload_hash, status, prioridade, "
                "mensagem, data_hora, data_hora_inicial) "
                "SELECT CAST(:process AS varchar), '{\"n\": ' || g || '}', "
                "convert_to(md5(g::text) || md5(g::text), 'UTF8'), CAST(:status AS varchar), 50, "
                "CAST(:message AS varchar), "
                "clock_timestamp() - (g % 5000000) * interval '1 second', "
                "clock_timestamp() - (g % 5000000) * interval '1 second' "
                "FROM generate_series(1, :n) AS g"
            ),
            {
                "n": n,
                "status": status,
                "process": process,
                "message": "Concluído com sucesso" if status == "sucesso" else None,
            },
        )


def _vacuum(engine: Any, table: str = TABLE) -> None:
    """VACUUM ANALYZE, then an immediate CHECKPOINT: the 5M-row fill writes
    ~1.5 GB of WAL, and without it the spread checkpoint that follows
    (about 4.5 minutes here) wrote in the background of the timed runs."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {table}"))
        conn.execute(text("CHECKPOINT"))


def _processing_rate(
    engine: Any, url: str, n: int, steady: bool = False, worker: type[Noop] = Noop
) -> float:
    """One burst worker processes n fresh 'run' tasks; the same conditions
    (a vacuumed, analysed table) with and without the finished rows.

    By default the CHECKPOINT falls between the preload and the timed run,
    so the run pays a full-page write for every index page it is first to
    touch. ``steady`` puts it before the preload: the enqueue touches those
    pages first, as when a task is processed within the checkpoint interval
    in which it was enqueued."""
    table = worker.model.__tablename__
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {table} WHERE processo = 'run'"))
    if steady:
        _vacuum(engine, table)
    _preload(engine, n, "pendente", "run", table)
    if steady:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"ANALYZE {table}"))
    else:
        _vacuum(engine, table)
    started = time.perf_counter()
    worker().run(url, burst=True)
    seconds = time.perf_counter() - started
    with engine.connect() as conn:
        done = conn.execute(
            text(f"SELECT count(*) FROM {table} WHERE processo = 'run' AND status = 'sucesso'")
        ).scalar()
    assert done == n, f"{done} of {n} processed"
    return n / seconds


def _idle_cost(url: str, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqla_queue.cli",
            "worker",
            "benchmarks.growth:Noop",
            "--url",
            url,
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        engine = create_engine(url)
        # autocommit: pg_stat_activity is a snapshot within one transaction
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while not conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'")
            ).scalar():
                if time.monotonic() > deadline:
                    raise RuntimeError("the idle worker never started listening")
                time.sleep(0.1)
        engine.dispose()
        time.sleep(2)  # let start-up settle before measuring the idle state

        def cpu() -> float:
            fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLK_TCK

        def rss_kib() -> int:
            status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
            return next(
                int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
            )

        before, t0 = cpu(), time.monotonic()
        samples = []
        while time.monotonic() - t0 < seconds:  # one RSS sample a second
            samples.append(rss_kib())
            time.sleep(1)
        used, elapsed = cpu() - before, time.monotonic() - t0
        return {
            "rss_mib": samples[-1] / 1024,
            "rss_mib_max": max(samples) / 1024,
            "cpu_share_of_core": used / elapsed,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--finished", type=int, default=5_000_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--output", default="growth.json", help="file name in --results")
    parser.add_argument(
        "--steady",
        action="store_true",
        help="checkpoint before the preload, not between it and the timed run",
    )
    parser.add_argument(
        "--sql",
        action="append",
        default=[],
        help="a statement to run on each table after it is made, {table} for its name "
        "(to measure another index definition)",
    )
    args = parser.parse_args()
    url = normalize_url(args.url).render_as_string(hide_password=False)
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        for table in (TABLE, EMPTY_TABLE):
            for statement in args.sql:
                conn.execute(text(statement.format(table=table)))
    result: dict[str, Any] = {
        "url": normalize_url(args.url).render_as_string(),
        "tasks": args.tasks,
        "sql": args.sql,
    }
    try:
        started = time.perf_counter()
        _preload(engine, args.finished, "sucesso", "noop")
        _vacuum(engine)
        result["fill_seconds"] = time.perf_counter() - started
        result["finished_rows"] = args.finished
        result["empty"], result["full"] = [], []
        for worker in (EmptyNoop, Noop):  # a round each, not counted: caches, first touches
            _processing_rate(engine, url, args.tasks, args.steady, worker)
        for _ in range(args.reps):  # in turns: drift hits both sides alike
            for key, worker in (("empty", EmptyNoop), ("full", Noop)):
                rate = _processing_rate(engine, url, args.tasks, args.steady, worker)
                result[key].append(rate)
        result["idle"] = _idle_cost(url, args.idle_seconds)
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()
    empty, full = statistics.median(result["empty"]), statistics.median(result["full"])
    result["ratio"] = full / empty
    results = pathlib.Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / args.output).write_text(json.dumps(result, indent=1))
    print("| table | tasks/s median (min-max) |\n|---|---|")
    print(f"| empty | {empty:,.0f} ({min(result['empty']):,.0f}-{max(result['empty']):,.0f}) |")
    print(
        f"| {args.finished:,} finished rows | {full:,.0f} "
        f"({min(result['full']):,.0f}-{max(result['full']):,.0f}) |"
    )
    print(f"ratio full/empty: {result['ratio']:.2f}")
    print(
        f"idle worker: {result['idle']['rss_mib']:.1f} MiB RSS "
        f"(max {result['idle']['rss_mib_max']:.1f}), "
        f"{100 * result['idle']['cpu_share_of_core']:.2f}% of a core"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
