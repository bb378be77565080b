"""Pub/sub on SQLite: one publication, two subscriptions, one worker class.

    python examples/pubsub.py
    SQLA_QUEUE_URL=mysql://root@127.0.0.1/test python examples/pubsub.py

1. Two subscriptions of the process "pedido" are written to the subscriber
   table ("indice" and "auditoria").
2. An order and its publication are written in ONE transaction.
3. ``Pedidos().run(burst=True)`` (or ``sqla-queue worker examples.pubsub:Pedidos``)
   fans the publication out to one task per subscription, in the transaction
   that marks it ``sucesso``, then runs each copy with its own method.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import (
    QueueClient,
    QueueMixin,
    SubscriberMixin,
    SubscriptionRecord,
    TaskRecord,
    WorkerPubSubBase,
    normalize_url,
    subscriber,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATABASE = os.environ.get("SQLA_QUEUE_URL", f"sqlite:///{ROOT / 'pubsub.db'}")


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "fila_pedidos"


class Subscriber(SubscriberMixin, Base):
    __tablename__ = "fila_pedidos_subscriber"


class Log(Base):
    __tablename__ = "log_pedidos"
    id: Mapped[int] = mapped_column(primary_key=True)
    line: Mapped[str] = mapped_column(String(200))


class Pedidos(WorkerPubSubBase):
    model = Task
    subscriber_model = Subscriber
    retry_interval_minutes = 0

    @subscriber("indice")
    def index(
        self, payload: Any, subscription: SubscriptionRecord, task: TaskRecord, session: Session
    ) -> str:
        session.add(Log(line=f"indexed order {payload['pedido']}"))
        return "indexed"

    @subscriber("auditoria")
    def audit(
        self, payload: Any, subscription: SubscriptionRecord, task: TaskRecord, session: Session
    ) -> str:
        session.add(Log(line=f"audited order {payload['pedido']} for tenant {task.tenant}"))
        return "audited"


def main() -> None:
    # mysql:// and postgresql:// name no driver: SQLAlchemy's create_engine
    # would load MySQLdb or psycopg2; normalize_url picks the extras' drivers
    # (PyMySQL, psycopg 3), as sqla-queue's own engines do
    engine = create_engine(normalize_url(DATABASE))
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all(
            [
                Subscriber(id="indice", process="pedido"),
                Subscriber(id="auditoria", process="pedido", tenant=7),
                Subscriber(id="desligada", process="pedido", active=False),
            ]
        )
    with Session(engine) as session, session.begin():
        # the business change and its publication commit together
        QueueClient(session, Task).insert_task_pub_sub(
            "loja", "erp", "pedido", "42", {"pedido": 42}, tenant=7
        )
    Pedidos().run(engine=engine, burst=True)
    with Session(engine) as session:
        for task in session.scalars(select(Task).order_by(Task.id)):
            print(task.id, task.subscriber_id or "(publication)", task.status, task.message)
        for line in session.scalars(select(Log.line).order_by(Log.id)):
            print(line)


if __name__ == "__main__":
    main()
