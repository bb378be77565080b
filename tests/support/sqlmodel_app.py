"""QueueMixin on a SQLModel table model, for tests/integration/test_frameworks.py
and its worker subprocesses (the table name from ``SQLA_QUEUE_TEST_TABLE``)."""

from __future__ import annotations

import os
from typing import Any

from sqlmodel import Field, SQLModel

from sqla_queue import QueueMixin, WorkerBase

TABLE = os.environ.get("SQLA_QUEUE_TEST_TABLE", "fila_sqlmodel")


class Task(QueueMixin, SQLModel, table=True):
    __tablename__ = TABLE


class Billed(SQLModel, table=True):
    __tablename__ = f"{TABLE}_billed"

    order: int = Field(primary_key=True)
    total: int


class Billing(WorkerBase):
    model = Task
    processes = frozenset({"faturar"})

    def execute(self, payload: Any, task: Any, session: Any) -> str:
        session.add(Billed(order=payload["order"], total=payload["total"]))
        return f"billed {payload['order']}"
