"""The five-minute path, on SQLite: enqueue with a business change, run a worker.

    make quickstart            # or: python examples/quickstart.py

1. An invoice and its "faturar" task are written in ONE transaction.
2. A second transaction is rolled back: neither its invoice nor its task exists.
3. The real CLI, ``sqla-queue worker examples.quickstart:Faturar --burst``,
   processes the queue and exits once no task is ready; the handler's write
   (the invoice's ``faturada`` flag) commits together with the task's ``sucesso``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

from sqlalchemy import Boolean, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import QueueMixin, TaskRecord, WorkerBase, install

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATABASE = os.environ.get("SQLA_QUEUE_URL", f"sqlite:///{ROOT / 'quickstart.db'}")


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoice"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    faturada: Mapped[bool] = mapped_column(Boolean, default=False)


class Task(QueueMixin, Base):
    __tablename__ = "fila_faturamento"


class Faturar(WorkerBase):
    model = Task
    processes = frozenset({"faturar"})  # other workers' tasks on this table are not its own

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str:
        invoice = session.get(Invoice, payload["invoice"])
        assert invoice is not None
        invoice.faturada = True  # commits with the task's 'sucesso', or not at all
        return f"invoice {invoice.id} billed for {invoice.customer}"


def main() -> None:
    engine = create_engine(DATABASE)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    install(Session)

    with Session(engine) as session, session.begin():
        invoice = Invoice(customer="ACME")
        session.add(invoice)
        session.flush()
        session.add(
            Task(
                process="faturar",
                payload={"invoice": invoice.id},
                priority=80,
                external_key=str(invoice.id),
            )
        )
    print("enqueued: invoice 1 and its task, in one transaction")

    with Session(engine) as session, session.begin():
        session.add(Invoice(customer="rolled back"))
        session.add(Task(process="faturar", payload={"invoice": 2}))
        session.rollback()
    print("rolled back: invoice 2 and its task were never written")

    print("running: sqla-queue worker examples.quickstart:Faturar --burst")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_queue.cli",
            "worker",
            "examples.quickstart:Faturar",
            "--url",
            DATABASE,
            "--burst",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        check=True,
    )

    with Session(engine) as session:
        for task in session.scalars(select(Task).order_by(Task.id)):
            print(
                f"task {task.id}: process={task.process} payload={task.payload} "
                f"status={task.status} mensagem={task.message!r}"
            )
        for invoice in session.scalars(select(Invoice).order_by(Invoice.id)):
            print(f"invoice {invoice.id}: customer={invoice.customer} faturada={invoice.faturada}")
    engine.dispose()


if __name__ == "__main__":
    main()
