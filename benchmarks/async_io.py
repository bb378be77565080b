"""Async workers against sync ones on I/O-bound handlers (issue 26's target).

Every handler awaits (async) or sleeps (sync) ``--io-ms`` of I/O, then
returns; one worker process each (the real CLI, ``--burst``), on the same
PostgreSQL table, one configuration after another:

- sync, 1 lane (the default ``--concurrency 1``);
- sync, N lanes (N threads);
- async, N coroutine lanes (``--concurrency N``).

``BENCH_BATCH_SECONDS`` sets both classes' ``batch_seconds`` (default 0.1,
the default of every worker).

The rate is the tasks over the span from the first claim (``started_at``)
to the last commit (``finished_at``), from the table itself, so the
processes' start-up is not counted. Autovacuum is off on this machine's
server; the table is new for each configuration (no dead tuples).

    .venv/bin/python benchmarks/async_io.py [--url URL] [--io-ms 50] [--lanes 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import QueueClient, QueueMixin, WorkerBase

ROOT = Path(__file__).resolve().parent.parent
TABLE = os.environ.get("BENCH_ASYNC_IO_TABLE", "bench_async_io")
IO_SECONDS = float(os.environ.get("BENCH_ASYNC_IO_SECONDS", "0.05"))


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE


class SyncIO(WorkerBase):
    model = Task
    batch_seconds = float(os.environ.get("BENCH_BATCH_SECONDS", "0.1"))

    def execute(self, payload: Any, task: Any, session: Any) -> None:
        time.sleep(IO_SECONDS)  # the handler's I/O (a blocking client)


class AsyncIO(WorkerBase):
    model = Task
    batch_seconds = float(os.environ.get("BENCH_BATCH_SECONDS", "0.1"))

    async def execute(self, payload: Any, task: Any, session: Any) -> None:
        await asyncio.sleep(IO_SECONDS)  # the handler's I/O (an async client)


def run(url: str, worker: str, lanes: int, tasks: int, io_ms: float) -> dict[str, Any]:
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        QueueClient(conn, Task).insert_tasks([{"process": "io"}] * tasks)
    env = {
        **os.environ,
        "BENCH_ASYNC_IO_TABLE": TABLE,
        "BENCH_ASYNC_IO_SECONDS": str(io_ms / 1000),
        "PYTHONPATH": str(ROOT),
    }
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_queue.cli",
            "worker",
            f"benchmarks.async_io:{worker}",
            "--url",
            url,
            "--burst",
            "--concurrency",
            str(lanes),
            "--log-level",
            "WARNING",
        ],
        check=True,
        cwd=ROOT,
        env=env,
    )
    wall = time.perf_counter() - started
    with engine.connect() as conn:
        done, first, last = conn.execute(
            select(func.count(), func.min(Task.started_at), func.max(Task.finished_at)).where(
                Task.status == "sucesso"
            )
        ).one()
    Base.metadata.drop_all(engine)
    engine.dispose()
    span = (last - first).total_seconds()
    return {"worker": worker, "lanes": lanes, "tasks": done, "span": span, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--io-ms", type=float, default=50.0)
    parser.add_argument("--lanes", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="about how long each runs")
    args = parser.parse_args()
    per_lane = 1000 / args.io_ms  # tasks a second one lane can do at best
    runs = [
        ("SyncIO", 1),
        ("SyncIO", args.lanes),
        ("AsyncIO", args.lanes),
    ]
    batch = os.environ.get("BENCH_BATCH_SECONDS", "0.1")
    where = args.url.split("@")[-1]
    print(f"# {args.io_ms:g} ms of I/O per task, one process each, {where}, batch_seconds={batch}")
    print("| worker | lanes | tasks | span s | tasks/s | x sync 1 lane |")
    print("|---|---:|---:|---:|---:|---:|")
    base = None
    for worker, lanes in runs:
        tasks = int(per_lane * lanes * args.seconds)
        result = run(args.url, worker, lanes, tasks, args.io_ms)
        rate = result["tasks"] / result["span"]
        base = base or rate
        print(
            f"| {worker} | {lanes} | {result['tasks']} | {result['span']:.2f} | {rate:,.0f} "
            f"| {rate / base:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
