"""Worker CPU per task of two sqla-queue checkouts, in turns, PostgreSQL.

    git worktree add --detach /tmp/wt_old 4d3b162
    for i in 1 2 3 4 5 6; do
      .venv/bin/python benchmarks/ab_processing.py /tmp/wt_old ab_old
      .venv/bin/python benchmarks/ab_processing.py . ab_new
    done

Each run imports sqla-queue from CHECKOUT (not the installed one), makes
TABLE afresh with that checkout's mixin, loads 20,000 pending no-op tasks
(VACUUM ANALYZE after), runs one burst worker in this process and prints
``rate/cpu``: tasks per second of wall time, and the process's CPU time
(user + system, every thread) per task. On this noisy 2-core VM the wall
rate of one run swings by a third; the CPU per task is the steadier figure
for a change to the worker's Python side (2026-11-24: 4d3b162 about 31 µs,
c700cf0 about 34.5 µs). The server's own time per statement is not in it.

``--metrics`` attaches the Prometheus metrics (sqla_queue.ops.metrics) to the
worker's hooks first: metrics on against off, for the same checkout::

    for i in 1 2 3 4 5 6; do
      .venv/bin/python benchmarks/ab_processing.py . ab_off
      .venv/bin/python benchmarks/ab_processing.py . ab_on --metrics
    done
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

TASKS = 20_000


def load_noop_tasks(engine: Any, table: str, count: int = TASKS) -> None:
    """``count`` pending no-op tasks in ``table`` (emptied first), then
    VACUUM ANALYZE: every run starts from the same table."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}"))
        conn.execute(
            text(
                f"INSERT INTO {table} (processo, payload) "
                f"SELECT 'noop', '{{\"n\": 1}}' FROM generate_series(1, {count})"
            )
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {table}"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkout", type=Path, help="a sqla-queue source tree")
    parser.add_argument("table", help="the queue table to make (and drop) for this run")
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--metrics", action="store_true", help="with the Prometheus metrics on")
    parser.add_argument("--tasks", type=int, default=TASKS, help="tasks to load and process")
    args = parser.parse_args()
    checkout = str(args.checkout.resolve())
    sys.path.insert(0, checkout)

    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import DeclarativeBase

    import sqla_queue

    if not str(sqla_queue.__file__).startswith(checkout):
        raise SystemExit(f"sqla_queue came from {sqla_queue.__file__}, not {checkout}")

    class Base(DeclarativeBase):
        pass

    task = type("Task", (sqla_queue.QueueMixin, Base), {"__tablename__": args.table})

    class Noop(sqla_queue.WorkerBase):
        model = task

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    engine = create_engine(args.url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    load_noop_tasks(engine, args.table, args.tasks)
    engine.dispose()

    if args.metrics:
        from sqla_queue.ops.metrics import QueueMetrics

        QueueMetrics(args.table).attach()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    Noop().run(args.url, burst=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    engine = create_engine(args.url)
    with engine.connect() as conn:
        done = conn.execute(
            text(f"SELECT count(*) FROM {args.table} WHERE status = 'sucesso'")
        ).scalar_one()
    Base.metadata.drop_all(engine)
    engine.dispose()
    if done != args.tasks:
        raise SystemExit(f"{done} of {args.tasks} tasks processed")
    print(f"{args.tasks / seconds:.0f}/{cpu / args.tasks * 1e6:.1f}us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
