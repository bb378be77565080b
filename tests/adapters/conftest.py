"""The adapter contract's fixture: one adapter on a fresh queue table, on
each real database (tests/adapters/test_adapter_contract.py and
test_adapter_conformance.py).

SQLite, PostgreSQL, PostgreSQL behind a transaction-pooling PgBouncer
(per-task locks off, as docs/pgbouncer.md sets it), MariaDB, and SingleStore
when ``SQLA_QUEUE_TEST_SINGLESTORE_URL`` names a server (skipped otherwise).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, select

from sqla_queue.adapters import Adapter, adapter_for
from sqla_queue.client.queue import _task_row
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import normalize_url
from sqla_queue.schema.mixins import channel_of
from tests.conftest import server_url
from tests.support.app import App, build
from tests.support.servers import PgBouncer

DATABASES = ["sqlite", "postgresql", "pgbouncer", "mysql", "singlestore"]
OWNER, OTHER = "worker-a", "worker-b"


def past(minutes: float) -> dt.datetime:
    """``minutes`` ago."""
    return utcnow() - dt.timedelta(minutes=minutes)


@dataclass
class Contract:
    engine: Engine
    adapter: Adapter
    app: App
    #: the engine reaches its server through a pooler (PgBouncer)
    pooled: bool = False

    def insert(self, conn: Connection, **values: Any) -> int:
        """One task, as QueueClient.insert_task writes it."""
        row = _task_row(
            {"processo": "faturar", "payload": {"n": 1}, **values}, pub_sub=False, now=utcnow()
        )
        return self.adapter.task_insert_one(conn, row=row)

    def status(self, task_id: int) -> str:
        c = self.adapter.table.c
        with self.engine.connect() as conn:
            return str(conn.execute(select(c.status).where(c.id == task_id)).scalar())

    def claim(self, limit: int = 10, owner: str = OWNER) -> list[int]:
        with self.engine.connect() as conn:
            with conn.begin():
                tasks = self.adapter.task_claim_many(
                    conn, limit=limit, owner=owner, lease_seconds=30
                )
            return [task.id for task in tasks]


@pytest.fixture(params=DATABASES)
def contract(request: pytest.FixtureRequest, tmp_path: Path, table_name: str) -> Iterator[Contract]:
    kind = request.param
    task_locks = True
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'queue.db'}"
    elif kind == "singlestore":
        url = os.environ.get("SQLA_QUEUE_TEST_SINGLESTORE_URL", "")
        if not url:
            pytest.skip("no SingleStore server: set SQLA_QUEUE_TEST_SINGLESTORE_URL")
    elif kind == "pgbouncer":
        factory: Callable[..., PgBouncer] = request.getfixturevalue("pgbouncer_factory")
        url = factory("transaction", pool_size=4).url
        task_locks = False  # docs/pgbouncer.md: session locks leak behind transaction pooling
    else:
        url = server_url(kind)
    engine = create_engine(normalize_url(url))
    app = build(table_name)
    app.Base.metadata.create_all(engine)
    table: Any = app.Task.__table__
    adapter = adapter_for(engine.dialect, table, channel_of(app.Task, table), task_locks=task_locks)
    adapter.prepare_engine(engine)
    try:
        yield Contract(engine, adapter, app, pooled=kind == "pgbouncer")
    finally:
        app.Base.metadata.drop_all(engine)
        engine.dispose()
