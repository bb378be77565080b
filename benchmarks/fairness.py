"""Per-key fairness (docs/fairness.md): a small tenant's wait behind a big one.

Tenant 1 enqueues ``--backlog`` no-op tasks (default 100,000), then tenant 2
enqueues 10. One worker process (the real CLI, ``--burst``, batched, one
lane) drains the queue, once in plain claim order and once with
``fair_by = "tenant"``, each on a fresh table. Reported from the table
itself: the small tenant's wait (its tasks' enqueue to their claim,
``started_at``), and the rate over the whole run (first claim to last
commit). PostgreSQL by default; autovacuum is off on this machine's server.

    .venv/bin/python benchmarks/fairness.py [--url URL] [--backlog 100000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import QueueClient, QueueMixin, WorkerBase

ROOT = Path(__file__).resolve().parent.parent
TABLE = os.environ.get("BENCH_FAIRNESS_TABLE", "bench_fairness")


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE
    __queue_fair_by__ = ("tenant",)


class Plain(WorkerBase):
    model = Task

    def execute(self, payload: Any, task: Any, session: Any) -> None:
        return None


class Fair(Plain):
    fair_by = "tenant"


def run(url: str, worker: str, backlog: int) -> dict[str, float]:
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        client = QueueClient(conn, Task)
        for start in range(0, backlog, 10_000):
            client.insert_tasks([{"process": "p", "tenant": 1}] * min(10_000, backlog - start))
        client.insert_tasks([{"process": "p", "tenant": 2}] * 10)
    env = {**os.environ, "BENCH_FAIRNESS_TABLE": TABLE, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_queue.cli",
            "worker",
            f"benchmarks.fairness:{worker}",
            "--url",
            url,
            "--burst",
            "--log-level",
            "ERROR",
        ],
        check=True,
        cwd=ROOT,
        env=env,
    )
    c = Task.__table__.c
    with engine.connect() as conn:
        first, last, done = conn.execute(
            select(func.min(c.started_at), func.max(c.finished_at), func.count()).where(
                c.status == "sucesso"
            )
        ).one()
        small = conn.execute(
            select(c.data_hora, c.started_at).where(c.tenant == 2).order_by(c.id)
        ).all()
    Base.metadata.drop_all(engine)
    engine.dispose()
    waits = sorted((started - enqueued).total_seconds() for enqueued, started in small)
    # the small tenant's wait counted from the worker's first claim (the
    # backlog was enqueued before the worker started)
    from_start = sorted((started - first).total_seconds() for _, started in small)
    return {
        "done": done,
        "rate": done / (last - first).total_seconds(),
        "small_last_s": from_start[-1],
        "small_first_s": from_start[0],
        "small_wait_max_s": waits[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--backlog", type=int, default=100_000)
    args = parser.parse_args()
    where = args.url.split("@")[-1]
    print(f"# tenant 1: {args.backlog:,} tasks, then tenant 2: 10 tasks; one worker, {where}")
    print(
        "| claim | tasks | tasks/s | tenant 2's first claimed after | "
        "tenant 2's last claimed after |"
    )
    print("|---|---:|---:|---:|---:|")
    for worker, label in (("Plain", "plain order"), ("Fair", 'fair_by = "tenant"')):
        r = run(args.url, worker, args.backlog)
        print(
            f"| {label} | {r['done']:,} | {r['rate']:,.0f} | {r['small_first_s']:.3f} s "
            f"| {r['small_last_s']:.3f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
