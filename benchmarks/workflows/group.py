"""A group of N no-op steps and its callback against N independent no-op
tasks, same worker, same run (issue 51's acceptance: the group at no less
than 0.8x the independent tasks' rate; the callback released within 1 s of
the last step's commit). PostgreSQL, a burst worker of --concurrency lanes
started after the enqueue (`sqla-queue worker ... --burst`), timed from its
start to its exit (``rate``: the process's start-up, about half a second,
in both) and from the first task's start to the last one's finish, read
from the rows (``processing_rate``: the steady state); reps interleaved.

    .venv/bin/python benchmarks/workflows/group.py [--n 10000] [--lanes 4] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Session

from sqla_queue import QueueClient, QueueMixin, TaskRecord, WorkerBase, group, install

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "bench_workflow_group"
URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DB}"
HERE = Path(__file__).resolve().parent


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "wf_bench"


class Noop(WorkerBase):
    model = Task
    processes = frozenset({"p"})

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> None:
        return None


def fresh() -> None:
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    engine = create_engine(URL)
    Base.metadata.create_all(engine)
    engine.dispose()


def run_worker(lanes: int) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli", "worker", "group:Noop", "--url", URL,
         "--concurrency", str(lanes), "--burst", "--log-level", "WARNING"],
        check=True, cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)},
    )  # fmt: skip
    return time.perf_counter() - started


def _processing_seconds(conn: Any, *where: Any) -> float:
    """From the first task's start to the last one's finish (the rows' own
    clock: the database's)."""
    first, last = conn.execute(
        select(func.min(Task.started_at), func.max(Task.finished_at)).where(*where)
    ).one()
    return float((last - first).total_seconds())


def independent(n: int, lanes: int) -> dict[str, Any]:
    fresh()
    engine = create_engine(URL)
    enqueue_started = time.perf_counter()
    with engine.begin() as conn:
        QueueClient(conn, Task).insert_tasks(
            {"process": "p", "payload": {"i": i}} for i in range(n)
        )
    enqueue_seconds = time.perf_counter() - enqueue_started
    seconds = run_worker(lanes)
    with engine.connect() as conn:
        done = conn.execute(select(func.count()).where(Task.status == "sucesso")).scalar_one()
        processing = _processing_seconds(conn)
    engine.dispose()
    return {
        "kind": "independent",
        "n": n,
        "done": done,
        "seconds": seconds,
        "rate": n / seconds,
        "processing_seconds": processing,
        "processing_rate": n / processing,
        "enqueue_seconds": enqueue_seconds,
    }


def grouped(n: int, lanes: int) -> dict[str, Any]:
    fresh()
    install(Session)
    engine = create_engine(URL)
    enqueue_started = time.perf_counter()
    with Session(engine, expire_on_commit=False) as session, session.begin():
        steps = [Task(process="p", payload={"i": i}) for i in range(n)]
        callback = Task(process="p", payload={"callback": True})
        group(*steps).then(callback).enqueue(session)
    enqueue_seconds = time.perf_counter() - enqueue_started
    seconds = run_worker(lanes)
    with engine.connect() as conn:
        done = conn.execute(select(func.count()).where(Task.status == "sucesso")).scalar_one()
        last_parent = conn.execute(
            select(func.max(Task.finished_at)).where(Task.id != callback.id)
        ).scalar_one()
        released, started = conn.execute(
            select(Task.run_at, Task.started_at).where(Task.id == callback.id)
        ).one()
        processing = _processing_seconds(conn, Task.id != callback.id)
    engine.dispose()
    return {
        "kind": "group",
        "n": n,
        "done": done,
        "seconds": seconds,
        "rate": n / seconds,
        "processing_seconds": processing,
        "processing_rate": n / processing,
        "enqueue_seconds": enqueue_seconds,
        "callback_released_after_last_parent_s": (released - last_parent).total_seconds(),
        "callback_started_after_last_parent_s": (started - last_parent).total_seconds(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", default=str(HERE.parent / "results" / "workflow_group.json"))
    args = parser.parse_args()
    results = []
    for rep in range(args.reps):
        for case in (independent, grouped) if rep % 2 == 0 else (grouped, independent):
            result = {"rep": rep + 1, **case(args.n, args.lanes)}
            print(json.dumps(result), flush=True)
            results.append(result)
    Path(args.output).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
