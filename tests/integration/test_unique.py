"""Unique tasks (sqla_queue/enqueue/unique.py, docs/unique.md) on every database:
the three policies through QueueClient and the ORM, what counts as a
duplicate (waiting, running, retrying, succeeded within the period) and
what does not (failed, cancelled, rolled back, another tenant, no key),
and several processes enqueuing the same keys at once."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, inspect, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, DuplicateTaskError, QueueClient, Unique, duplicate_of
from sqla_queue.adapters.unique import LIVE_KEY_COLUMN
from sqla_queue.common.types import utcnow
from sqla_queue.enqueue.unique import live_index_name, unique_table
from sqla_queue.testing import run_until_empty
from tests.conftest import ROOT, created_engine, lock_waits, wait_until
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


# ------------------------------------------------------ the live-key index
# A second live task of a unique process with the same key and tenant is
# refused by the database itself, whatever way it comes (docs/unique.md,
# "The live-key index"): DuplicateTaskError, the first task kept.
def live_rows(engine: Engine, task: Any, key: str) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(task.id, task.status)
            .where(
                task.external_key == key,
                task.status.in_(["pendente", "agendada", "processando"]),
                task.dead.is_(False),
            )
            .order_by(task.id)
        )
        return [(row.id, row.status) for row in rows]


def core_row(key: str | None, process: str = "pular", **values: Any) -> dict[str, Any]:
    """A row for a Core INSERT (every row of an executemany has the same keys)."""
    row = {"processo": process, "chave_externa": key, "status": "pendente", "tenant": None}
    return {**row, "dead": False, "subscriber_id": None, **values}


def refused(engine: Engine, *statement: Any) -> DuplicateTaskError:
    """``statement`` in a transaction of its own: refused (rolled back)."""
    with engine.connect() as conn:
        conn.begin()
        with pytest.raises(DuplicateTaskError) as caught:
            conn.execute(*statement)
        conn.rollback()
    assert "\n" not in str(caught.value)
    return caught.value


def test_the_live_key_index_is_made_with_the_table(uengine: Engine, uapp: Any) -> None:
    _, task, _ = uapp
    name = live_index_name(task.__tablename__)
    assert name == f"ix_{task.__tablename__}_unica"
    found = {ix["name"]: ix for ix in inspect(uengine).get_indexes(task.__tablename__)}
    assert found[name]["unique"]
    # no column of the model's: a select of the whole table reads as before
    assert LIVE_KEY_COLUMN not in task.__table__.c


def test_core_inserts_single_and_executemany_are_refused(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    table = task.__table__
    first = enqueue(uengine, task, processo="pular", chave_externa="k", payload={"n": 1})
    with uengine.connect() as conn:
        conn.begin()
        with pytest.raises(DuplicateTaskError, match=r"unique index ix_.*_unica") as caught:
            conn.execute(insert(table), core_row("k"))
        assert "\n" not in str(caught.value)
        conn.rollback()
        conn.begin()
        with pytest.raises(DuplicateTaskError):
            conn.execute(insert(table), [core_row("other"), core_row("k")])
        conn.rollback()  # the documented way out: nothing of the batch stays
    with Session(uengine) as session:  # the ORM bulk INSERT, through the hook's preparation
        with pytest.raises(DuplicateTaskError):
            session.execute(
                insert(task),
                [{"process": "recusar", "external_key": "z", "payload": {}}] * 2,
            )
        session.rollback()
        with pytest.raises(DuplicateTaskError):
            session.execute(
                insert(task), [{"process": "pular", "external_key": "k", "payload": {}}]
            )
        session.rollback()
    assert live_rows(uengine, task, "k") == [(first, "pendente")]
    assert [t.external_key for t in tasks(uengine, task)] == ["k"]
    # what is not a second live task of a unique process goes in
    with uengine.begin() as conn:
        conn.execute(
            insert(table),
            [
                core_row("k", process="livre"),  # not a unique process
                core_row("k", process="livre"),
                core_row("k", status="falha"),  # not live
                core_row("k", status="sucesso"),
                core_row("k", tenant=7),  # another tenant
                core_row("k", dead=True),  # a dead-letter run
                core_row("k", subscriber_id="s1"),  # pub/sub copies
                core_row("k", subscriber_id="s2"),
                core_row(None),  # no key
                core_row(None),
            ],
        )
    assert len(tasks(uengine, task)) == 11


def test_a_null_tenant_is_one_tenant(uengine: Engine, uapp: Any) -> None:
    _, task, _ = uapp
    with uengine.begin() as conn:
        conn.execute(insert(task.__table__), core_row("t", tenant=0))
        conn.execute(insert(task.__table__), core_row("t"))
    refused(uengine, insert(task.__table__), core_row("t"))
    refused(uengine, insert(task.__table__), core_row("t", tenant=0))


def test_a_client_on_the_table_name_and_the_async_client_are_refused(
    uengine: Engine, uapp: Any
) -> None:
    """A client built from a table name knows no declarations: the index
    refuses for it (and for AsyncQueueClient, the same client in a greenlet)."""
    from sqlalchemy.ext.asyncio import AsyncSession

    from sqla_queue import AsyncQueueClient
    from tests.integration.test_async_enqueue import run

    _, task, _ = uapp
    name = task.__tablename__
    first = enqueue(uengine, task, processo="pular", chave_externa="n", payload={})
    with Session(uengine) as session:
        with pytest.raises(DuplicateTaskError):
            QueueClient(session, name).insert_task(processo="pular", chave_externa="n")
        session.rollback()

    async def body(aengine: Any) -> None:
        async with AsyncSession(aengine) as session:
            with pytest.raises(DuplicateTaskError):
                await AsyncQueueClient(session, name).insert_task(
                    processo="pular", chave_externa="n"
                )
            await session.rollback()
            # built from the model: the policy (skip) answers, no error
            client = AsyncQueueClient(session, task)
            assert await client.insert_task(processo="pular", chave_externa="n") == first
            await session.rollback()

    run(uengine, body)
    assert live_rows(uengine, task, "n") == [(first, "pendente")]


def test_changing_the_key_cannot_make_a_second_live_task(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    a = enqueue(uengine, task, processo="pular", chave_externa="a", payload={})
    b = enqueue(uengine, task, processo="pular", chave_externa="b", payload={})
    refused(uengine, update(task).where(task.id == b).values(chave_externa="a"))
    with Session(uengine) as session:
        session.get(task, b).external_key = "a"
        with pytest.raises(DuplicateTaskError):
            session.flush()
        session.rollback()
    assert live_rows(uengine, task, "a") == [(a, "pendente")]
    assert live_rows(uengine, task, "b") == [(b, "pendente")]
    # a key let go by an UPDATE is free: the hook sees the holder changed
    with uengine.begin() as conn:
        conn.execute(update(task).where(task.id == a).values(chave_externa="c"))
    fresh = enqueue(uengine, task, processo="pular", chave_externa="a", payload={})
    assert fresh not in (a, b)
    assert enqueue(uengine, task, processo="pular", chave_externa="a", payload={}) == fresh


def test_retry_now_keeps_one_live_task(uengine: Engine, uapp: Any, installed: None) -> None:
    _, task, _ = uapp
    later = utcnow() + dt.timedelta(days=1)
    first = enqueue(uengine, task, processo="pular", chave_externa="r", payload={}, data_hora=later)
    with Session(uengine) as session, session.begin():
        assert QueueClient(session, task).retry_now(first) == first
    assert live_rows(uengine, task, "r") == [(first, "pendente")]
    assert enqueue(uengine, task, processo="pular", chave_externa="r", payload={}) == first
    refused(uengine, insert(task.__table__), core_row("r", status="agendada"))
    assert live_rows(uengine, task, "r") == [(first, "pendente")]


def _dead_chain(engine: Engine, uapp: Any, key: str) -> int:
    """A task of 'pular' with ``key`` that went dead (its retries spent)."""
    _, task, worker = uapp
    failing = enqueue(engine, task, processo="pular", chave_externa=key, payload={"fail": 1})
    with Session(engine) as session:
        run_until_empty(worker, session)
        session.commit()
    assert live_rows(engine, task, key) == []
    return failing


def test_requeue_of_a_dead_task_whose_key_is_held_is_refused(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    dead = _dead_chain(uengine, uapp, "d")
    fresh = enqueue(uengine, task, processo="pular", chave_externa="d", payload={})
    before = len(tasks(uengine, task))
    with Session(uengine) as session:
        with pytest.raises(DuplicateTaskError, match=f"task {fresh} is pendente") as caught:
            QueueClient(session, task).requeue_dead([dead])
        assert str(caught.value).startswith("dead task ") and "\n" not in str(caught.value)
        session.rollback()
        # a client on the table's name cannot check: the index refuses
        with pytest.raises(DuplicateTaskError):
            QueueClient(session, task.__tablename__).requeue_dead([dead])
        session.rollback()
    assert len(tasks(uengine, task)) == before
    assert live_rows(uengine, task, "d") == [(fresh, "pendente")]
    # the key freed, the requeue goes through and the new chain holds the key
    with Session(uengine) as session, session.begin():
        QueueClient(session, task).cancel(fresh)
    with Session(uengine) as session, session.begin():
        [requeued] = QueueClient(session, task).requeue_dead([dead])
    assert requeued.new_id is not None
    assert live_rows(uengine, task, "d") == [(requeued.new_id, "pendente")]
    assert enqueue(uengine, task, processo="pular", chave_externa="d", payload={}) == (
        requeued.new_id
    )


def test_two_dead_tasks_of_one_key_are_not_both_requeued(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    _, task, _ = uapp
    first = _dead_chain(uengine, uapp, "t")
    second = _dead_chain(uengine, uapp, "t")
    with Session(uengine) as session:
        with pytest.raises(DuplicateTaskError, match="have one unique key"):
            QueueClient(session, task).requeue_dead([first, second])
        session.rollback()
    assert live_rows(uengine, task, "t") == []


def test_sqla_queue_requeue_refuses_in_one_line(
    db_url: str, uengine: Engine, uapp: Any, installed: None, tmp_path: Any
) -> None:
    from tests.conftest import run_cli

    _, task, _ = uapp
    dead = _dead_chain(uengine, uapp, "cli")
    fresh = enqueue(uengine, task, processo="pular", chave_externa="cli", payload={})
    (tmp_path / "requeue_app.py").write_text(
        "from tests.support.unique_app import build\n"
        f"_, Task, Worker = build({task.__tablename__!r})\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}"}
    proc = run_cli(
        "requeue", "requeue_app:Worker", "--id", str(dead), "--url", db_url, env=env, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert line.startswith("Error: dead task ") and f"task {fresh} is pendente" in line
    assert "Traceback" not in proc.stderr
    assert live_rows(uengine, task, "cli") == [(fresh, "pendente")]


def test_two_sessions_inserting_one_key_at_once_one_wins(uengine: Engine, uapp: Any) -> None:
    """Around the hook (Core inserts): the second insert waits for the
    first's transaction on the index entry and is refused once it commits
    (SQLite: one writer at a time, the second insert waits for the lock)."""
    _, task, _ = uapp
    table = task.__table__
    outcome: list[BaseException | None] = []
    first = uengine.connect()
    first.begin()
    first.execute(insert(table), core_row("c"))

    def second() -> None:
        try:
            with uengine.begin() as conn:
                conn.execute(insert(table), core_row("c"))
            outcome.append(None)
        except BaseException as exc:  # the outcome is the test's
            outcome.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    try:
        if uengine.dialect.name == "postgresql":
            wait_until(lambda: _pg_waits(uengine) > 0, message="the second insert to wait")
        elif uengine.dialect.name != "sqlite":
            wait_until(lambda: lock_waits(uengine, table.name) > 0, interval=0.15)
    finally:
        first.commit()
        first.close()
        thread.join(timeout=60)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, DuplicateTaskError)
    assert len(live_rows(uengine, task, "c")) == 1


def _pg_waits(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        )


def test_a_table_without_the_index_keeps_working_and_the_operation_adds_it(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    """A table made before the index: the hook still checks (the Core
    bypass is open); alembic's create_queue_unique_index adds it."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from sqla_queue.alembic import CreateQueueUniqueIndexOp, DropQueueUniqueIndexOp

    _, task, _ = uapp
    name = task.__tablename__
    with uengine.begin() as conn:
        Operations(MigrationContext.configure(conn)).invoke(
            DropQueueUniqueIndexOp(name, ["pular", "trocar"])
        )
    assert live_index_name(name) not in {ix["name"] for ix in inspect(uengine).get_indexes(name)}
    first = enqueue(uengine, task, processo="pular", chave_externa="o", payload={})
    assert enqueue(uengine, task, processo="pular", chave_externa="o", payload={}) == first
    with uengine.begin() as conn:  # around the hook, nothing stops it now
        conn.execute(insert(task.__table__), core_row("o"))
    # the index cannot be made while two live tasks share a key
    with pytest.raises(DuplicateTaskError), uengine.begin() as conn:
        Operations(MigrationContext.configure(conn)).invoke(
            CreateQueueUniqueIndexOp(name, ["pular", "trocar", "recusar", "periodo"])
        )
    with uengine.begin() as conn:
        conn.execute(update(task).where(task.id == first).values(status="falha"))
    with uengine.begin() as conn:
        Operations(MigrationContext.configure(conn)).invoke(
            CreateQueueUniqueIndexOp(name, ["pular", "trocar", "recusar", "periodo"])
        )
    refused(uengine, insert(task.__table__), core_row("o"))


def test_ddl_unique_process_makes_the_live_key_index(tmp_path: Any) -> None:
    import sqlite3

    from sqlalchemy import create_engine

    from tests.conftest import run_cli

    script = run_cli(
        "ddl", "main", "fila_ddlu", "--unique-process", "pular", "--dialect", "sqlite"
    ).stdout
    assert "CREATE TABLE fila_ddlu_unique" in script
    assert "CREATE UNIQUE INDEX ix_fila_ddlu_unica ON fila_ddlu" in script
    assert "CREATE UNIQUE INDEX ix_fila_ddlu_tenant_unica ON fila_ddlu" in script
    path = tmp_path / "ddl.db"
    with sqlite3.connect(path) as db:
        db.executescript(script)
    _, task, _ = build("fila_ddlu")
    engine = create_engine(f"sqlite:///{path}")
    try:
        enqueue(engine, task, processo="pular", chave_externa="d", payload={})
        refused(engine, insert(task.__table__), core_row("d"))
    finally:
        engine.dispose()


def test_the_spark_writer_is_refused_and_its_dedupe_still_skips(uengine: Engine, uapp: Any) -> None:
    """A partition of Spark's enqueue (called as Spark's executor calls it;
    the table named, so no declarations: COPY on PostgreSQL) that holds a
    live key is refused and rolled back; with dedupe it skips the key, as
    it did before the index."""
    import dataclasses

    import pyarrow as pa

    from sqla_queue.spark import writer

    _, task, _ = uapp
    first = enqueue(uengine, task, processo="pular", chave_externa="s0", payload={})
    spec = writer.WriteSpec(
        url=uengine.url.render_as_string(hide_password=False),
        table=task.__tablename__,
        channel=task.__tablename__,
        process="pular",
        payload_columns=("n",),
        single_payload=False,
        key_column="key",
        tenant_column=None,
        priority_column=None,
        run_at_column=None,
        priority=None,
        run_at=None,
        dedupe=None,
    )
    keys = ["s1", "s0", "s2"]
    batch = pa.RecordBatch.from_pydict(
        {
            "n": list(range(len(keys))),
            writer.KEY: keys,
            writer.BUCKET: [sum(map(ord, k)) % writer.LOCK_BUCKETS for k in keys],
        }
    )
    with pytest.raises(DuplicateTaskError, match=r"ix_\w+_unica") as caught:
        list(writer.write_partition(spec, [batch]))
    assert "\n" not in str(caught.value)
    assert [t.id for t in tasks(uengine, task)] == [first]
    deduped = dataclasses.replace(spec, dedupe="key")
    [result] = next(iter(writer.write_partition(deduped, [batch]))).to_pylist()
    assert (result["enqueued"], result["duplicates"], result["error"]) == (2, 1, None)
    assert live_rows(uengine, task, "s0") == [(first, "pendente")]


def test_the_flush_hook_meets_the_index_for_a_task_written_around_it(
    uengine: Engine, uapp: Any, installed: None
) -> None:
    """docs/unique.md, limits: a live task the key table does not know (a
    Core INSERT) makes the hook's enqueue of its key fail with the index's
    DuplicateTaskError, not the policy's answer; nothing else is lost."""
    _, task, _ = uapp
    with uengine.begin() as conn:
        conn.execute(insert(task.__table__), core_row("x"))
    [(held, _)] = live_rows(uengine, task, "x")
    with Session(uengine) as session:
        session.add(task(process="pular", external_key="x", payload={}))
        with pytest.raises(DuplicateTaskError, match="unique index"):
            session.flush()
        session.rollback()
    with Session(uengine) as session:
        with pytest.raises(DuplicateTaskError):
            QueueClient(session, task).insert_task(processo="pular", chave_externa="x")
        session.rollback()
    assert live_rows(uengine, task, "x") == [(held, "pendente")]
