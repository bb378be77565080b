"""A pub/sub application for the tests, in-process and in CLI worker subprocesses.

``build(table)`` makes a fresh declarative Base with a queue model, its
subscriber table, a business table and worker classes. Subprocess workers
import this module as ``tests.support.pubsub_app`` and get the table name from
``SQLA_QUEUE_TEST_TABLE``. With ``SQLA_QUEUE_TEST_FANOUT_PAUSE`` set to a
directory, every fan-out stops before its third chunk statement, after
touching ``in-fanout`` there, until a ``go`` file appears (SIGKILL tests).
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import (
    QueueMixin,
    SubscriberMixin,
    WorkerBase,
    WorkerPubSubBase,
    dead_subscriber,
    subscriber,
)
from sqla_queue.stages.fanout import FanOut


@dataclass
class PubSubApp:
    Base: type[DeclarativeBase]
    Task: Any
    Subscriber: Any
    Effect: Any
    PubSubWorker: type[WorkerPubSubBase]
    PlainWorker: type[WorkerBase]


def build(table: str) -> PubSubApp:
    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table

    class Subscriber(SubscriberMixin, Base):
        __tablename__ = f"{table}_subscriber"

    class Effect(Base):
        __tablename__ = f"{table}_effect"
        id: Mapped[int] = mapped_column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True
        )
        task_id: Mapped[int] = mapped_column(BigInteger)
        note: Mapped[str | None] = mapped_column(String(200))

    class PubSubWorker(WorkerPubSubBase):
        model = Task
        subscriber_model = Subscriber
        max_retry = 2
        retry_interval_minutes = 0
        lease_seconds = float(os.environ.get("SQLA_QUEUE_TEST_LEASE", "30"))

        @subscriber("ok")
        def handle_ok(self, payload: Any, subscription: Any, task: Any, session: Any) -> str:
            note = f"ok:{payload['pedido']}:{subscription.id}:{subscription['processo']}"
            session.add(Effect(task_id=task.id, note=note))
            return "ok done"

        @subscriber("fails")
        def handle_fails(self, payload: Any, subscription: Any, task: Any, session: Any) -> None:
            session.add(Effect(task_id=task.id, note="should vanish"))
            session.flush()
            raise RuntimeError("subscriber 'fails' failed on purpose")

        @dead_subscriber("fails")
        def handle_fails_dead(
            self, payload: Any, subscription: Any, task: Any, session: Any
        ) -> str:
            session.add(Effect(task_id=task.id, note=f"dead:{subscription.id}"))
            return "dead handled"

    class PlainWorker(WorkerBase):
        model = Task
        retry_interval_minutes = 0
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, note=f"plain:{task.process}"))
            return None

    return PubSubApp(Base, Task, Subscriber, Effect, PubSubWorker, PlainWorker)


def _pause_in_fanout(inserted: int) -> None:
    """Between chunk statements: say so, then wait for a go file (the test
    kills the process first)."""
    if inserted < 2000:
        return
    directory = pathlib.Path(os.environ["SQLA_QUEUE_TEST_FANOUT_PAUSE"])
    (directory / "in-fanout").touch()
    deadline = time.monotonic() + 60
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go file within 60 s")
        time.sleep(0.01)  # the paused fan-out, not a test wait


if os.environ.get("SQLA_QUEUE_TEST_FANOUT_PAUSE"):
    FanOut.between_chunks = staticmethod(_pause_in_fanout)  # type: ignore[assignment]

_app = build(os.environ.get("SQLA_QUEUE_TEST_TABLE", "fila_pubsub"))
Task = _app.Task
Subscriber = _app.Subscriber
Effect = _app.Effect
PubSubWorker = _app.PubSubWorker
PlainWorker = _app.PlainWorker
