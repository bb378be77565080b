"""Fan-out of one publication to N subscribers (default 1,000), on PostgreSQL.

    python benchmarks/fanout.py [--url URL] [--subscribers 1000] [--reps 5]

Each repetition publishes one task, claims it with a pub/sub worker's
manager, and times its batch: reading the matching subscriptions, building
and hashing the N copy payloads, inserting them (chunks of 1,000 rows per
statement, COPY from 64 rows on psycopg), and the guarded ``sucesso`` with
its commit. Prints each time and the median. Tables are created under a
fresh name and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, insert, select
from sqlalchemy.orm import DeclarativeBase

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqla_queue import (
    QueueClient,
    QueueMixin,
    SubscriberMixin,
    WorkerPubSubBase,
    subscriber,
)
from sqla_queue.config.settings import Settings
from sqla_queue.worker import Runner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    name = f"bench_fanout_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = name

    class Subscriber(SubscriberMixin, Base):
        __tablename__ = f"{name}_subscriber"

    class Worker(WorkerPubSubBase):
        model = Task
        subscriber_model = Subscriber

        @subscriber("none")
        def none(self, *_: Any) -> None: ...

    engine = create_engine(args.url)
    Base.metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(Subscriber),
                [
                    {"id": f"s{n:06d}", "processo": "pedido", "headers": {"X-N": str(n)}}
                    for n in range(args.subscribers)
                ],
            )
        runner = Runner.for_worker(Worker(), engine=engine, settings=Settings())
        manager = runner.manager
        times = []
        with runner.adapter.connect_claim(engine) as claim, engine.connect() as work:
            for _ in range(args.reps + 1):  # the first is a warm-up
                with engine.begin() as conn:
                    pub = QueueClient(conn, Task).insert_task_pub_sub(
                        "o", "d", "pedido", "k", {"pedido": 1, "itens": list(range(20))}
                    )
                tasks = manager.claim(claim, limit=1)
                assert [t.id for t in tasks] == [pub]
                started = time.perf_counter()
                result = manager.run_batch(claim, work, tasks, runner.worker.dispatch)
                times.append(time.perf_counter() - started)
                assert result.succeeded == 1
                with engine.connect() as conn:
                    copies = conn.execute(
                        select(func.count()).where(Task.publication_id == pub)
                    ).scalar_one()
                assert copies == args.subscribers, copies
        measured = times[1:]
        print(
            f"fan-out of one publication to {args.subscribers} subscribers "
            f"({engine.dialect.name}+{engine.dialect.driver}): "
            f"median {statistics.median(measured) * 1000:.1f} ms, "
            f"min {min(measured) * 1000:.1f} ms over {len(measured)} runs "
            f"({args.subscribers / statistics.median(measured):,.0f} copies/s); "
            f"runs: {', '.join(f'{t * 1000:.1f}' for t in measured)} ms"
        )
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
