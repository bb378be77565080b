"""Unique tasks (sqla_queue/unique.py, docs/unique.md) on every database:
the three policies through QueueClient and the ORM, what counts as a
duplicate (waiting, running, retrying, succeeded within the period) and
what does not (failed, cancelled, rolled back, another tenant, no key),
and several processes enqueuing the same keys at once."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, inspect, select, update
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, DuplicateTaskError, QueueClient, Unique, duplicate_of
from sqla_queue.testing import run_until_empty
from sqla_queue.types import utcnow
from sqla_queue.unique import unique_table
from tests.conftest import ROOT, created_engine
from tests.support.unique_app import build


@pytest.fixture
def uapp(table_name: str) -> Any:
    return build(table_name)


@pytest.fixture
def uengine(db_url: str, uapp: Any) -> Iterator[Engine]:
    with created_engine(db_url, uapp[0].metadata) as engine:
        yield engine


def tasks(engine: Engine, task: Any, process: str | None = None) -> list[Any]:
    with Session(engine) as session:
        query = select(task).order_by(task.id)
        if process is not None:
            query = query.where(task.process == process)
        return list(session.scalars(query))


def enqueue(engine: Engine, task: Any, **values: Any) -> int:
    with Session(engine) as session, session.begin():
        return QueueClient(session, task).insert_task(**values)


def test_the_key_table_is_made_with_the_queue_table(uengine: Engine, uapp: Any) -> None:
    _, task, _ = uapp
    keys = unique_table(task.__table__)
    assert keys.name == f"{task.__tablename__}_unique"
    assert inspect(uengine).has_table(keys.name)


def test_skip_returns_the_waiting_task_and_enqueues_nothing(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    first = enqueue(uengine, task, processo="pular", chave_externa="nf-1", payload={"n": 1})
    assert enqueue(uengine, task, processo="pular", chave_externa="nf-1", payload={"n": 2}) == first
    # another key, another tenant, no key at all: new tasks
    other = enqueue(uengine, task, processo="pular", chave_externa="nf-2", payload={})
    tenant = enqueue(uengine, task, processo="pular", chave_externa="nf-1", tenant=7, payload={})
    keyless = [enqueue(uengine, task, processo="pular", payload={}) for _ in range(2)]
    assert len({first, other, tenant, *keyless}) == 5
    # the ORM: the duplicate is left out of the session, and says of whom
    with Session(uengine) as session, session.begin():
        again = task(process="pular", external_key="nf-1", payload={"n": 3})
        session.add(again)
        session.flush()
        assert again not in session and duplicate_of(again) == first
    assert [t.payload for t in tasks(uengine, task) if t.external_key == "nf-1"] == [
        {"n": 1},
        {},
    ]


def test_the_same_key_twice_in_one_flush_or_one_batch_enqueues_one(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    with Session(uengine) as session, session.begin():
        a = task(process="pular", external_key="x", payload={"n": 1})
        b = task(process="pular", external_key="x", payload={"n": 2})
        session.add_all([a, b])
        session.flush()
        assert duplicate_of(b) == a.id and duplicate_of(a) is None
        a_id = a.id
    with Session(uengine) as session, session.begin():
        ids = QueueClient(session, task).insert_tasks(
            [
                {"processo": "pular", "chave_externa": "y", "payload": {"n": 1}},
                {"processo": "pular", "chave_externa": "y", "payload": {"n": 2}},
                {"processo": "pular", "chave_externa": "x", "payload": {"n": 3}},
            ]
        )
    assert ids[0] == ids[1] and ids[2] == a_id
    assert len(tasks(uengine, task)) == 2


def test_replace_gives_a_waiting_task_the_new_payload_and_run_time(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    later = utcnow() + dt.timedelta(days=1)
    first = enqueue(
        uengine, task, processo="trocar", chave_externa="r", payload={"v": 1}, data_hora=later
    )
    with Session(uengine) as session, session.begin():
        new = task(process="trocar", external_key="r", payload={"v": 2}, priority=9)
        session.add(new)
    assert duplicate_of(new) == first
    [row] = tasks(uengine, task)
    assert (row.payload, row.priority, row.status) == ({"v": 2}, 9, "pendente")
    assert row.payload_hash == new.payload_hash
    # running: nothing to replace, nothing enqueued
    with uengine.begin() as conn:
        conn.execute(update(task).where(task.id == first).values(status="processando"))
    assert enqueue(uengine, task, processo="trocar", chave_externa="r", payload={"v": 3}) == first
    [row] = tasks(uengine, task)
    assert row.payload == {"v": 2}


def test_error_raises_and_the_transaction_keeps_nothing(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    first = enqueue(uengine, task, processo="recusar", chave_externa="e", payload={})
    with pytest.raises(DuplicateTaskError, match=f"task {first} is pendente"):
        enqueue(uengine, task, processo="recusar", chave_externa="e", payload={})
    with Session(uengine) as session:
        session.add(task(process="recusar", external_key="e", payload={}))
        with pytest.raises(DuplicateTaskError, match="unique, policy 'error'"):
            session.flush()
        session.rollback()
    assert len(tasks(uengine, task)) == 1


def test_retries_count_a_finished_or_failed_chain_does_not_the_period_does(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, worker = uapp

    class Patient(worker):  # type: ignore[misc,valid-type]
        retry_interval_minutes = 60

    failing = enqueue(uengine, task, processo="pular", chave_externa="f", payload={"fail": 1})
    with Session(uengine) as session:  # one attempt fails: its retry waits, and counts
        run_until_empty(Patient, session)
        session.commit()
    assert [t.status for t in tasks(uengine, task)] == ["falha", "agendada"]
    assert enqueue(uengine, task, processo="pular", chave_externa="f", payload={}) == failing
    # the chain runs out of retries: it no longer counts
    with Session(uengine) as session:
        QueueClient(session, task).retry_now(failing)
        run_until_empty(worker, session)
        session.commit()
    fresh = enqueue(uengine, task, processo="pular", chave_externa="f", payload={})
    assert fresh != failing
    # succeeded: no period, a new one is enqueued; within the period, not
    with Session(uengine) as session:
        run_until_empty(worker, session)
        session.commit()
    assert enqueue(uengine, task, processo="pular", chave_externa="f", payload={}) != fresh
    done = enqueue(uengine, task, processo="periodo", chave_externa="p", payload={})
    with Session(uengine) as session:
        run_until_empty(worker, session)
        session.commit()
    assert enqueue(uengine, task, processo="periodo", chave_externa="p", payload={}) == done
    keys = unique_table(task.__table__)
    with uengine.begin() as conn:  # the period passed
        conn.execute(update(keys).values(taken_at=utcnow() - dt.timedelta(hours=2)))
    assert enqueue(uengine, task, processo="periodo", chave_externa="p", payload={}) != done


def test_a_cancelled_or_rolled_back_task_frees_its_key(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    with Session(uengine) as session:
        QueueClient(session, task).insert_task(processo="pular", chave_externa="c", payload={})
        session.rollback()
    first = enqueue(uengine, task, processo="pular", chave_externa="c", payload={})
    with Session(uengine) as session, session.begin():
        QueueClient(session, task).cancel(first)
    assert enqueue(uengine, task, processo="pular", chave_externa="c", payload={}) != first


def test_bad_declarations_are_one_line_errors() -> None:
    for bad, message in (
        (lambda: Unique("p", policy="ignore"), "policy must be one of skip, replace, error"),  # type: ignore[arg-type]
        (lambda: Unique("p", period=dt.timedelta(0)), "period must be a positive timedelta"),
        (lambda: Unique(""), "process must be a non-empty string"),
    ):
        with pytest.raises(ConfigurationError, match=message) as caught:
            bad()
        assert "\n" not in str(caught.value)
    from sqlalchemy.orm import DeclarativeBase

    from sqla_queue import QueueMixin

    class Base(DeclarativeBase):
        pass

    with pytest.raises(ConfigurationError, match="names process 'p' twice"):

        class Twice(QueueMixin, Base):
            __tablename__ = "fila_twice"
            __queue_unique__ = (Unique("p"), Unique("p", policy="error"))


def test_processes_enqueuing_the_same_keys_at_once_enqueue_each_once(
    db_url: str, uengine: Engine, uapp: Any
) -> None:
    _, task, _ = uapp
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.unique_app", db_url, task.__tablename__, "12"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    with uengine.connect() as conn:
        per_key = dict(
            conn.execute(select(task.external_key, func.count()).group_by(task.external_key)).all()
        )
    assert per_key == {f"k{n}": 1 for n in range(5)}


def test_ddl_unique_prints_the_key_table_create_all_makes(tmp_path: Any) -> None:
    """`sqla-queue ddl main QUEUE --unique --dialect sqlite`, run by sqlite3,
    makes the key table a model with __queue_unique__ uses."""
    import sqlite3

    from sqlalchemy import create_engine

    from tests.conftest import run_cli

    script = run_cli("ddl", "main", "fila_ddl", "--unique", "--dialect", "sqlite").stdout
    assert "CREATE TABLE fila_ddl_unique" in script
    path = tmp_path / "ddl.db"
    with sqlite3.connect(path) as db:
        db.executescript(script)
    _, task, _ = build("fila_ddl")
    engine = create_engine(f"sqlite:///{path}")
    try:
        first = enqueue(engine, task, processo="pular", chave_externa="d", payload={})
        assert enqueue(engine, task, processo="pular", chave_externa="d", payload={}) == first
    finally:
        engine.dispose()
