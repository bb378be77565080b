"""A FastAPI app that enqueues in the request's own transaction (docs/async.md).

    pip install 'sqla-queue[sqlite]' fastapi uvicorn
    uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/invoices -H 'content-type: application/json' \\
        -d '{"customer": "ACME"}'                     # {"invoice_id": 1, "task_id": 1}
    curl localhost:8000/tasks/1                       # {"id": 1, "status": "pendente"}
    sqla-queue worker examples.fastapi_app:Faturar --url sqlite:///fastapi-example.db --burst
    curl localhost:8000/tasks/1                       # {"id": 1, "status": "sucesso"}

``POST /invoices`` writes the invoice and its "faturar" task in one
AsyncSession transaction: both commit, or neither does. The flush hook,
installed on AsyncSession at startup, completes the task row as it does
for a sync Session. The database is SQLite through aiosqlite unless
``SQLA_QUEUE_URL`` names another (``postgresql+psycopg://...``,
``mysql+asyncmy://...``); the worker, a sync process, takes the same
database's sync URL. The tables are made at startup.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import Boolean, String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import QueueMixin, TaskRecord, WorkerBase, install

DEFAULT_URL = "sqlite+aiosqlite:///fastapi-example.db"


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
    processes = frozenset({"faturar"})

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str:
        invoice = session.get(Invoice, payload["invoice"])
        assert invoice is not None
        invoice.faturada = True  # commits with the task's 'sucesso', or not at all
        return f"invoice {invoice.id} billed for {invoice.customer}"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = create_async_engine(os.environ.get("SQLA_QUEUE_URL", DEFAULT_URL))
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    install(AsyncSession)
    # expire_on_commit=False: the task's id stays readable after the commit
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(session)]


class NewInvoice(BaseModel):
    customer: str = Field(min_length=1, max_length=100)


@app.post("/invoices", status_code=201)
async def create_invoice(body: NewInvoice, session: SessionDep) -> dict[str, int]:
    async with session.begin():
        invoice = Invoice(customer=body.customer)
        session.add(invoice)
        await session.flush()  # the invoice's id, for the task's payload
        task = Task(
            process="faturar", payload={"invoice": invoice.id}, external_key=str(invoice.id)
        )
        session.add(task)
    return {"invoice_id": invoice.id, "task_id": task.id}


@app.get("/tasks/{task_id}")
async def task_status(task_id: int, session: SessionDep) -> dict[str, Any]:
    task = await session.get(Task, task_id)
    if task is None:
        raise HTTPException(status_code=404, detail=f"no task {task_id}")
    return {"id": task.id, "status": task.status}
