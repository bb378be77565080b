"""What the Prometheus metrics cost a worker: CPU per task with them on and
off, in one process, alternated (ABBA) so that the machine's drift falls on
both sides alike.

    .venv/bin/python benchmarks/metrics_cost.py [--checkout PATH] [--rounds 8] [--url URL]

Each run loads 20,000 pending no-op tasks (VACUUM ANALYZE after) and drains
them with one burst worker; the metrics (sqla_queue.ops.metrics.QueueMetrics,
on a registry of their own) are attached for the "on" runs and detached
after. Prints each run (tasks/s of wall time, process CPU per task) and the
medians; the CPU per task is the steadier figure on a shared VM. With
``--checkout`` an older source tree is measured (its own metrics module).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TASKS = 20_000
TABLE = "bench_metrics_cost"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    sys.path.insert(0, str(args.checkout.resolve()))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ab_processing import load_noop_tasks
    from prometheus_client import CollectorRegistry
    from sqlalchemy import create_engine
    from sqlalchemy.orm import DeclarativeBase

    import sqla_queue
    from sqla_queue.ops.metrics import QueueMetrics

    class Base(DeclarativeBase):
        pass

    task = type("Task", (sqla_queue.QueueMixin, Base), {"__tablename__": TABLE})

    class Noop(sqla_queue.WorkerBase):
        model = task
        processes = frozenset({"noop"})

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    engine = create_engine(args.url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)

    cpu: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for round_ in range(args.rounds):
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                load_noop_tasks(engine, TABLE, TASKS)
                metrics = None
                if mode == "on":
                    metrics = QueueMetrics(TABLE, registry=CollectorRegistry()).attach()
                cpu_started, started = time.process_time(), time.perf_counter()
                Noop().run(args.url, burst=True)
                per_task = (time.process_time() - cpu_started) / TASKS * 1e6
                rate = TASKS / (time.perf_counter() - started)
                if metrics is not None:
                    metrics.detach()
                cpu[mode].append(per_task)
                print(f"{mode:3} {rate:7.0f} tasks/s {per_task:6.1f} µs CPU/task", flush=True)
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()
    off, on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    pairs = [b - a for a, b in zip(cpu["off"], cpu["on"], strict=True)]
    print(
        f"median CPU/task: off {off:.1f} µs, on {on:.1f} µs (+{(on / off - 1) * 100:.1f}%); "
        f"median paired difference {statistics.median(pairs):+.1f} µs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
