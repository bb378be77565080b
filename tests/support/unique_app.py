"""A queue model with unique processes (sqla_queue/enqueue/unique.py), one per
policy, and a worker; ``python -m tests.support.unique_app URL TABLE
ROUNDS`` enqueues the same keys ROUNDS times, half through QueueClient and
half through the ORM, each in its own transaction that reads the queue
first (the concurrency test runs several of these processes at once)."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Session

from sqla_queue import QueueClient, QueueMixin, Unique, WorkerBase, install

UNIQUE = (
    Unique("pular", policy="skip"),
    Unique("trocar", policy="replace"),
    Unique("recusar", policy="error"),
    Unique("periodo", policy="skip", period=dt.timedelta(hours=1)),
)


def build(table: str) -> Any:
    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table
        __queue_configuration__ = f"{table}_configuration"
        __queue_unique__ = UNIQUE

    class Worker(WorkerBase):
        model = Task
        retry_interval_minutes = 0
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and payload.get("fail"):
                raise RuntimeError("asked to fail")
            return None

    return Base, Task, Worker


def main(url: str, table: str, rounds: int) -> int:
    _, task, _ = build(table)
    install(Session)
    engine = create_engine(url)
    for n in range(rounds):
        for key in range(5):
            with Session(engine) as session, session.begin():
                # the business transaction reads first: on MariaDB its
                # snapshot then predates the other processes' enqueues
                session.scalar(select(func.count()).select_from(task))
                if n % 2:
                    session.add(task(process="pular", external_key=f"k{key}", payload={"n": n}))
                else:
                    QueueClient(session, task).insert_task(
                        processo="pular", chave_externa=f"k{key}", payload={"n": n}
                    )
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
