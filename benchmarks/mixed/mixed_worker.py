"""sqla-queue's side of benchmarks/mixed/bench.py: the queue table, the
effect table, the enqueue (the public API: ``session.add(Task(...))`` in one
transaction) and the workers, run as a user would
(``sqla-queue worker mixed_worker:Job --concurrency N``).

A handler sleeps its task's duration, then writes its effect row through
the Session it is given: the row commits with the task's ``sucesso``. In
the ``bimodal`` case it first reads (``SELECT 1`` on that Session), as a
handler that loads a row before a slow call: its transaction is open while
it sleeps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import DateTime, Integer, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import QueueMixin, TaskRecord, WorkerBase, install


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "mix_tasks"


class Effect(Base):
    __tablename__ = "mix_effect"

    job_key: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    t: Mapped[Any] = mapped_column(DateTime(timezone=True), server_default=func.clock_timestamp())


class Job(WorkerBase):
    model = Task
    processes = frozenset({"job"})

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> None:
        if payload.get("r"):  # read first, as a handler loads its invoice before the call
            session.execute(select(1))
        time.sleep(payload["s"])
        session.add(Effect(job_key=payload["k"]))


class AsyncJob(WorkerBase):
    model = Task
    processes = frozenset({"job"})

    async def execute(self, payload: Any, task: TaskRecord, session: Any) -> None:
        if payload.get("r"):
            await session.execute(select(1))
        await asyncio.sleep(payload["s"])
        session.add(Effect(job_key=payload["k"]))


def _sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://")


def create(url: str) -> None:
    """The queue table (the effect table exists already)."""
    engine = create_engine(_sqlalchemy_url(url))
    Task.__table__.create(engine)
    engine.dispose()


class Enqueuer:
    """Enqueues as an application does: ``session.add`` in its transaction."""

    def __init__(self, url: str, *, read_first: bool = False) -> None:
        install(Session)
        self.engine = create_engine(_sqlalchemy_url(url))
        self.extra = {"r": True} if read_first else {}

    def enqueue(self, part: list[tuple[int, float]]) -> list[int]:
        with Session(self.engine) as session, session.begin():
            tasks = [Task(process="job", payload={"k": k, "s": s, **self.extra}) for k, s in part]
            session.add_all(tasks)
            session.flush()
            return [task.id for task in tasks]

    def close(self) -> None:
        self.engine.dispose()
