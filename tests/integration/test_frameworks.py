"""QueueMixin on a SQLModel model end to end, on every database: the ORM
enqueue in SQLModel's Session, the real worker command, ``status``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, inspect

from tests.conftest import ROOT

TABLE = "fila_sqlmodel_t"


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli", *args],
        env={**os.environ, "SQLA_QUEUE_TEST_TABLE": TABLE, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    os.environ["SQLA_QUEUE_TEST_TABLE"] = TABLE
    from sqlmodel import SQLModel

    from tests.support import sqlmodel_app

    engine = create_engine(db_url)
    tables = [sqlmodel_app.Task.__table__, sqlmodel_app.Billed.__table__]
    SQLModel.metadata.drop_all(engine, tables=tables)
    SQLModel.metadata.create_all(engine, tables=tables)
    try:
        yield engine
    finally:
        SQLModel.metadata.drop_all(engine, tables=tables)
        engine.dispose()


def test_a_sqlmodel_queue_model_enqueues_runs_and_shows_in_status(
    engine: Engine, db_url: str
) -> None:
    from sqlmodel import Session, select

    from sqla_queue import install, uninstall
    from tests.support.sqlmodel_app import Billed, Task

    install(Session)
    try:
        with Session(engine) as session:
            session.add_all(
                [Task(process="faturar", payload={"order": n, "total": 10 * n}) for n in (1, 2, 3)]
            )
            session.add(Task(process="faturar", payload={"order": 4, "total": 40}))
            session.rollback()  # the fourth goes with the business change it belonged to
            session.add_all(
                [Task(process="faturar", payload={"order": n, "total": 10 * n}) for n in (1, 2, 3)]
            )
            session.commit()
    finally:
        uninstall(Session)
    # the same table as a plain declarative model gets: the seed's columns
    columns = {c["name"] for c in inspect(engine).get_columns(TABLE)}
    assert {"processo", "chave_externa", "payload", "payload_hash", "tentativa"} <= columns

    done = _cli(db_url, "worker", "tests.support.sqlmodel_app:Billing", "--url", db_url, "--burst")
    assert done.returncode == 0, done.stderr

    with Session(engine) as session:
        rows = session.exec(select(Task.status, Task.message).order_by(Task.id)).all()
        assert [tuple(r) for r in rows] == [("sucesso", f"billed {n}") for n in (1, 2, 3)]
        assert sorted(b.total for b in session.exec(select(Billed)).all()) == [10, 20, 30]
        task = session.exec(select(Task).order_by(Task.id)).first()
        assert task is not None and task.payload == {"order": 1, "total": 10}

    status = _cli(db_url, "status", "tests.support.sqlmodel_app:Billing", "--url", db_url, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["totals"]["succeeded"] == 3
