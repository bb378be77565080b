"""sqla-queue's side of the nsj-queue-lib compatibility tests
(tests/integration/test_nsj_compat.py).

``build(table, schema=None, channel=None)`` maps a queue model onto a table
that either library made, with its subscriber table and an effect table
(one row per handler run, the same table the reference's handlers write
through tests/support/nsj_driver.py), and worker classes whose notes say which
library ran what, with which payload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import QueueMixin, SubscriberMixin, WorkerBase, WorkerPubSubBase, subscriber


@dataclass
class NsjApp:
    Base: type[DeclarativeBase]
    Task: Any
    Subscriber: Any
    Effect: Any
    Worker: type[WorkerBase]
    PubSubWorker: type[WorkerPubSubBase]


def note_of(attempt: int, payload: Any) -> str:
    """What a sqla-queue handler writes: the attempt and the payload it got."""
    return f"sqla:{attempt}:{json.dumps(payload, sort_keys=True)}"


def build(table: str, *, schema: str | None = None, channel: str | None = None) -> NsjApp:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Task(QueueMixin, Base):
        __tablename__ = table
        __queue_channel__ = channel

    class Subscriber(SubscriberMixin, Base):
        __tablename__ = f"{table}_subscriber"

    class Effect(Base):
        """One row per handler run, by either library."""

        __tablename__ = f"{table}_effect"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
        task_id: Mapped[int] = mapped_column(BigInteger)
        chain_id: Mapped[int] = mapped_column(BigInteger)
        note: Mapped[str | None] = mapped_column(String(200))

    class Worker(WorkerBase):
        """Fails attempts 1..n of a task whose payload is ``{"fail": n}``."""

        model = Task
        retry_interval_minutes = 0

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and task.attempt <= int(payload.get("fail", 0)):
                raise RuntimeError(f"asked to fail attempt {task.attempt}")
            session.add(
                Effect(task_id=task.id, chain_id=task.chain_id, note=note_of(task.attempt, payload))
            )
            return None

    class PubSubWorker(WorkerPubSubBase):
        """Fans publications out; runs the copies of subscription ``sqla-sub``."""

        model = Task
        subscriber_model = Subscriber
        retry_interval_minutes = 0

        @subscriber("sqla-sub")
        def on_copy(self, payload: Any, subscription: Any, task: Any, session: Any) -> str:
            # payload: the publication's, decoded (the reference gives the copy's)
            note = f"sqla-sub:{subscription.id}:{subscription['processo']}:{json.dumps(payload)}"
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note=note))
            return "sqla subscriber ran"

    return NsjApp(Base, Task, Subscriber, Effect, Worker, PubSubWorker)
