"""``QueueClient``: the seed's SDK calls, in the caller's transaction.

Runs against real SQLite, PostgreSQL and MariaDB databases. Rows are read
back with plain SQLAlchemy Core, by id, so each assertion checks what the
database holds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, String, create_engine, event, func, select, text, update
from sqlalchemy.exc import DBAPIError, InvalidRequestError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import (
    ConfigurationError,
    InvalidTaskError,
    JsonText,
    PayloadError,
    QueueClient,
    QueueMixin,
    TaskRecord,
    UnsupportedOperationError,
)
from sqla_queue.adapters.postgresql import PostgresAdapter
from tests.conftest import created_engine, server_url
from tests.support.app import App

UTC = dt.timezone.utc
PAST = dt.datetime(2021, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
postgresql_only = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _row(engine: Engine, app: App, task_id: int) -> dict[str, Any]:
    table = app.Task.__table__
    with engine.connect() as conn:
        return dict(conn.execute(select(table).where(table.c.id == task_id)).mappings().one())


def _count(engine: Engine, app: App) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(app.Task)).scalar_one()


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).hexdigest().encode("ascii")


# ---------------------------------------------------------- insert_task
def test_insert_task_takes_the_seed_positional_order(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        task_id = client.insert_task(
            "erp", "sefaz", "faturar", "7", {"invoice": 7}, 47, "G1", PAST, 80
        )
    assert isinstance(task_id, int)
    row = _row(engine, app, task_id)
    assert {
        k: row[k]
        for k in (
            "origem",
            "destino",
            "processo",
            "chave_externa",
            "payload",
            "tenant",
            "grupo_empresarial",
            "data_hora",
            "data_hora_inicial",
            "prioridade",
            "status",
            "tentativa",
            "pub_sub",
            "dead",
        )
    } == {
        "origem": "erp",
        "destino": "sefaz",
        "processo": "faturar",
        "chave_externa": "7",
        "payload": '{"invoice": 7}',
        "tenant": 47,
        "grupo_empresarial": "G1",
        "data_hora": PAST,
        "data_hora_inicial": PAST,
        "prioridade": 80,
        "status": "pendente",
        "tentativa": 1,
        "pub_sub": False,
        "dead": False,
    }
    assert bytes(row["payload_hash"]) == _digest('{"invoice": 7}')


def test_insert_task_accepts_english_keywords(engine: Engine, app: App) -> None:
    run_at = (dt.datetime.now(UTC) + dt.timedelta(hours=3)).replace(microsecond=5)
    with Session(engine) as s, s.begin():
        task_id = QueueClient(s, app.Task).insert_task(
            origin="erp",
            destination="sefaz",
            process="faturar",
            external_key="8",
            payload={"invoice": 8},
            tenant=48,
            company_group="G2",
            run_at=run_at,
            priority=90,
        )
    row = _row(engine, app, task_id)
    assert (
        row["origem"],
        row["destino"],
        row["processo"],
        row["chave_externa"],
        row["payload"],
        row["tenant"],
        row["grupo_empresarial"],
        row["data_hora"],
        row["data_hora_inicial"],
        row["prioridade"],
        row["status"],
    ) == (
        "erp",
        "sefaz",
        "faturar",
        "8",
        '{"invoice": 8}',
        48,
        "G2",
        run_at,
        run_at,
        90,
        "agendada",
    )


def test_insert_task_accepts_seed_keywords(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        task_id = QueueClient(s, app.Task).insert_task(
            "erp",
            "sefaz",
            processo="faturar",
            chave_externa="9",
            payload="texto",
            grupo_empresarial="G3",
            data_hora=PAST,
            prioridade=10,
        )
    row = _row(engine, app, task_id)
    assert (
        row["processo"],
        row["chave_externa"],
        row["payload"],
        row["grupo_empresarial"],
        row["data_hora"],
        row["prioridade"],
        row["status"],
        row["tenant"],
    ) == ("faturar", "9", "texto", "G3", PAST, 10, "pendente", None)


def test_insert_task_defaults(engine: Engine, app: App) -> None:
    before = dt.datetime.now(UTC)
    with Session(engine) as s, s.begin():
        task_id = QueueClient(s, app.Task).insert_task(process="faturar", payload={"k": 1})
    row = _row(engine, app, task_id)
    assert (
        row["origem"],
        row["chave_externa"],
        row["prioridade"],
        row["status"],
        row["tentativa"],
        row["pub_sub"],
        row["dead"],
        row["id_inicial"],
    ) == (None, None, 50, "pendente", 1, False, False, None)
    margin = dt.timedelta(minutes=5)
    assert before - margin <= row["data_hora"] <= dt.datetime.now(UTC) + margin
    assert before - margin <= row["data_hora_inicial"] <= dt.datetime.now(UTC) + margin


def test_naive_data_hora_means_utc(engine: Engine, app: App) -> None:
    naive = (dt.datetime.now(UTC) + dt.timedelta(days=2)).replace(tzinfo=None, microsecond=0)
    with engine.begin() as conn:
        task_id = QueueClient(conn, app.Task).insert_task(process="p", data_hora=naive)
    row = _row(engine, app, task_id)
    assert (row["data_hora"], row["status"]) == (naive.replace(tzinfo=UTC), "agendada")


@sqlite_only
def test_insert_task_rejects_bad_arguments(engine: Engine, app: App) -> None:
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        with pytest.raises(TypeError, match="unexpected argument 'queue'"):
            client.insert_task(process="p", queue="x")
        with pytest.raises(TypeError, match="given twice"):
            client.insert_task("o", "d", "p", processo="p")
        with pytest.raises(TypeError, match="given twice"):
            client.insert_task(process="p", processo="p")
        with pytest.raises(TypeError, match="at most 9 positional arguments"):
            client.insert_task(*range(10))
    assert _count(engine, app) == 0


def test_insert_task_rolls_back_with_the_session(engine: Engine, app: App) -> None:
    with Session(engine) as s:
        task_id = QueueClient(s, app.Task).insert_task("erp", "sefaz", "faturar", "1", {"k": 1})
        assert s.scalar(select(func.count()).select_from(app.Task)) == 1
        s.rollback()
    assert isinstance(task_id, int)
    assert _count(engine, app) == 0


def test_insert_task_rolls_back_with_the_connection(engine: Engine, app: App) -> None:
    with engine.connect() as conn:
        QueueClient(conn, app.Task).insert_task("erp", "sefaz", "faturar", "1", {"k": 1})
        conn.rollback()
    assert _count(engine, app) == 0


def test_insert_task_commits_with_the_business_row(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Effect(task_id=0, chain_id=0, note="business"))
        task_id = QueueClient(s, app.Task).insert_task(process="faturar", payload={"k": 1})
    assert _row(engine, app, task_id)["processo"] == "faturar"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(app.Effect)).scalar_one() == 1


def test_unserialisable_payload_raises_and_inserts_nothing(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        with pytest.raises(PayloadError, match="cannot be serialised to JSON"):
            client.insert_task(process="p", payload={"when": object()})
        # one bad task in a batch: none of the batch is inserted
        with pytest.raises(PayloadError, match="set is not JSON serializable"):
            client.insert_tasks(
                [{"process": "ok", "payload": {"k": 1}}, {"process": "bad", "payload": {"k": {1}}}]
            )
    assert _count(engine, app) == 0


# --------------------------------------------------------- insert_tasks
def test_insert_tasks_returns_ids_in_input_order(engine: Engine, app: App) -> None:
    future = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    tasks: list[dict[str, Any]] = [
        {"process": "p", "external_key": "0", "payload": {"i": 0}},
        {"process": "p", "external_key": "1", "payload": {"i": 1}, "run_at": PAST},
        {"process": "p", "external_key": "2", "payload": {"i": 2}},
        {"process": "p", "external_key": "3", "payload": {"i": 3}, "data_hora": future},
        {"processo": "p", "chave_externa": "4", "payload": {"i": 4}, "prioridade": 70},
    ]
    with Session(engine) as s, s.begin():
        ids = QueueClient(s, app.Task).insert_tasks(tasks)
    assert len(ids) == 5
    assert len(set(ids)) == 5
    rows = [_row(engine, app, task_id) for task_id in ids]
    assert [(r["chave_externa"], r["payload"], r["status"], r["prioridade"]) for r in rows] == [
        ("0", '{"i": 0}', "pendente", 50),
        ("1", '{"i": 1}', "pendente", 50),
        ("2", '{"i": 2}', "pendente", 50),
        ("3", '{"i": 3}', "agendada", 50),
        ("4", '{"i": 4}', "pendente", 70),
    ]
    assert rows[1]["data_hora"] == PAST
    assert rows[3]["data_hora"] == future
    assert rows[0]["data_hora"] is not None and rows[0]["data_hora"] != PAST


def test_insert_tasks_sets_pub_sub(engine: Engine, app: App) -> None:
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(
            [{"process": "evento", "payload": {"n": n}} for n in range(3)], pub_sub=True
        )
    assert [_row(engine, app, i)["pub_sub"] for i in ids] == [True, True, True]


@postgresql_only
def test_copy_tasks_returns_ids_in_input_order_on_postgresql(engine: Engine, app: App) -> None:
    future = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    tasks: list[dict[str, Any]] = [
        {
            "process": "p",
            "external_key": str(i),
            "payload": {"i": i},
            "tenant": i,
            **({"run_at": future} if i % 3 == 1 else {}),
        }
        for i in range(7)
    ]
    with Session(engine) as s, s.begin():
        ids = QueueClient(s, app.Task).copy_tasks(tasks)
    rows = [_row(engine, app, task_id) for task_id in ids]
    assert [
        (r["chave_externa"], r["tenant"], r["payload"], r["status"], r["prioridade"]) for r in rows
    ] == [
        (str(i), i, f'{{"i": {i}}}', "agendada" if i % 3 == 1 else "pendente", 50) for i in range(7)
    ]
    assert [bytes(r["payload_hash"]) for r in rows] == [_digest(f'{{"i": {i}}}') for i in range(7)]
    assert rows[1]["data_hora"] == future
    assert rows[1]["data_hora_inicial"] == future


@postgresql_only
def test_copy_tasks_rolls_back_with_the_session(engine: Engine, app: App) -> None:
    with Session(engine) as s:
        ids = QueueClient(s, app.Task).copy_tasks([{"process": "p"}, {"process": "q"}])
        assert len(ids) == 2
        s.rollback()
    assert _count(engine, app) == 0


@pytest.mark.parametrize("db_url", ["sqlite", "mysql"], indirect=True)
def test_copy_tasks_is_unsupported_elsewhere(engine: Engine, app: App) -> None:
    with engine.begin() as conn, pytest.raises(UnsupportedOperationError, match="COPY"):
        QueueClient(conn, app.Task).copy_tasks([{"process": "p"}])
    assert _count(engine, app) == 0


@sqlite_only
def test_insert_tasks_with_nothing_inserts_nothing(engine: Engine, app: App) -> None:
    with engine.begin() as conn:
        assert QueueClient(conn, app.Task).insert_tasks([]) == []
    assert _count(engine, app) == 0


# ------------------------------------------- the driver-level fast paths
# insert_task runs SQLAlchemy's compiled INSERT on the DBAPI cursor, and
# insert_tasks on PostgreSQL switches to COPY from COPY_THRESHOLD rows; both
# only while nothing watches the connection's statements.
mysql_and_postgresql = pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)


def test_insert_task_autobegins_like_conn_execute(engine: Engine, app: App) -> None:
    with engine.connect() as conn:
        task_id = QueueClient(conn, app.Task).insert_task(process="p", payload={"k": 1})
        assert conn.in_transaction()
        conn.commit()
    assert _row(engine, app, task_id)["payload"] == '{"k": 1}'


def test_insert_task_is_seen_by_statement_listeners(engine: Engine, app: App) -> None:
    seen: list[str] = []
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        quiet_id = client.insert_task(process="quiet")
        adapter = client._adapter(conn)
        assert any(adapter._direct_inserts.values())  # the cursor path was taken

        @event.listens_for(conn, "before_cursor_execute")
        def _seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            seen.append(statement)

        watched_id = client.insert_task(process="watched")
    assert [s for s in seen if s.startswith("INSERT INTO")], seen
    assert [_row(engine, app, i)["processo"] for i in (quiet_id, watched_id)] == [
        "quiet",
        "watched",
    ]


@sqlite_only
def test_insert_task_is_logged_by_echo(
    db_url: str, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(db_url, echo=True)
    app.Base.metadata.create_all(engine)
    try:
        with caplog.at_level("INFO", logger="sqlalchemy.engine"), engine.begin() as conn:
            QueueClient(conn, app.Task).insert_task(process="logged")
    finally:
        engine.dispose()
    assert any(r.getMessage().startswith("INSERT INTO") for r in caplog.records)


@mysql_and_postgresql
def test_insert_task_errors_are_sqlalchemy_errors(engine: Engine, app: App) -> None:
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        with pytest.raises(DBAPIError) as info:
            # a value sqla-queue leaves to the database: a number for a varchar(40)
            client.insert_task(process="p", company_group=10**50)
        assert not info.value.connection_invalidated
        conn.rollback()
        task_id = client.insert_task(process="after")  # the connection still works
        conn.commit()
    assert _row(engine, app, task_id)["processo"] == "after"
    assert _count(engine, app) == 1


def test_insert_task_refuses_a_closed_transaction_like_conn_execute(
    engine: Engine, app: App
) -> None:
    # a commit inside "with conn.begin()": conn.execute refuses to go on; the
    # insert must not start a new transaction that the block never commits
    with (
        engine.connect() as conn,
        pytest.raises(InvalidRequestError, match="closed transaction"),
        conn.begin(),
    ):
        conn.commit()
        QueueClient(conn, app.Task).insert_task(process="lost?")
    assert _count(engine, app) == 0


@mysql_and_postgresql
def test_insert_task_errors_reach_handle_error_listeners(engine: Engine, app: App) -> None:
    seen: list[Any] = []
    event.listen(engine, "handle_error", lambda context: seen.append(context.original_exception))
    with engine.connect() as conn, pytest.raises(DBAPIError):
        QueueClient(conn, app.Task).insert_task(process="p", company_group=10**50)
    assert len(seen) == 1


@postgresql_only
def test_copy_errors_are_sqlalchemy_errors(engine: Engine, app: App) -> None:
    # a value sqla-queue leaves to the database: a 51-digit number for a varchar(40)
    rows = [{"process": "p"}] * (PostgresAdapter.COPY_THRESHOLD - 1) + [{"company_group": 10**50}]
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        for insert_many in (client.insert_tasks, client.copy_tasks):
            with pytest.raises(DBAPIError) as info, conn.begin():
                insert_many(rows)
            assert "COPY" in str(info.value.statement)
            assert "value too long" in str(info.value.orig)
            assert not info.value.connection_invalidated
    assert _count(engine, app) == 0


def test_insert_tasks_refuses_too_long_text_instead_of_cutting_it(engine: Engine, app: App) -> None:
    with (
        engine.connect() as conn,
        pytest.raises(InvalidTaskError, match=r"^processo \(process\): 251 characters"),
        conn.begin(),
    ):
        QueueClient(conn, app.Task).insert_tasks([{"process": "q"}, {"process": "p" * 251}])
    assert _count(engine, app) == 0


@postgresql_only
def test_insert_task_on_a_dead_connection_invalidates_it(engine: Engine, app: App) -> None:
    with engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.commit()
        with engine.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
        with pytest.raises(DBAPIError) as info:
            QueueClient(conn, app.Task).insert_task(process="p")
        assert info.value.connection_invalidated
        assert conn.invalidated
        conn.rollback()
        # the pool hands out a new connection, and the next insert works
        task_id = QueueClient(conn, app.Task).insert_task(process="again")
        conn.commit()
    assert _row(engine, app, task_id)["processo"] == "again"


# ----------------------------------------- the INSERT handed to libpq
def _cursors_opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The psycopg cursors opened from now on."""
    import psycopg

    opened: list[Any] = []
    cursor = psycopg.Connection.cursor

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return cursor(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "cursor", counting)
    return opened


LIBPQ_VALUES: dict[str, Any] = {
    "origin": "órigem 'quoted' %s %(x)s",
    "destination": "",
    "process": "processo-ç",
    "external_key": "k" * 100,
    "payload": {"ação": "naïve", "n": 10**20, "pct": "100%", "list": [1.5, None, True]},
    "tenant": -(2**62),
    "company_group": "grupo",
    "run_at": dt.datetime(2099, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    "priority": 7,
}


@postgresql_only
def test_insert_task_on_psycopg_goes_to_libpq_and_stores_what_the_cursor_stores(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _cursors_opened(monkeypatch)
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        with conn.begin():  # idle: the BEGIN is sent with the statement
            direct = client.insert_task(**LIBPQ_VALUES)
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")  # in a transaction already
            naive = client.insert_task(process="naive", run_at=dt.datetime(2099, 1, 1))
        cursors = len(opened)  # the SELECT's
        assert cursors == 1
        monkeypatch.setenv("SQLA_QUEUE_LIBPQ_INSERT", "false")  # the cursor's path
        with conn.begin():
            through_cursor = client.insert_task(**LIBPQ_VALUES)
        assert len(opened) == cursors + 1
    ignore = {"id", "data_hora_inicial"}
    stored, expected = _row(engine, app, direct), _row(engine, app, through_cursor)
    assert {k: v for k, v in stored.items() if k not in ignore} == {
        k: v for k, v in expected.items() if k not in ignore
    }
    assert stored["status"] == "agendada"
    assert stored["data_hora"] == LIBPQ_VALUES["run_at"]
    assert _row(engine, app, naive)["data_hora"] == dt.datetime(2099, 1, 1, tzinfo=UTC)


@postgresql_only
def test_insert_task_on_psycopg_rolls_back_with_its_transaction(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _cursors_opened(monkeypatch)
    with Session(engine) as session, session.begin():
        session.add(app.Task(process="flushed", payload=1))
        QueueClient(session, app.Task).insert_task(process="kept")
    with Session(engine) as session, session.begin():
        session.add(app.Task(process="flushed, rolled back", payload=2))
        QueueClient(session, app.Task).insert_task(process="rolled back")
        session.rollback()
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        conn.begin()
        client.insert_task(process="gone")
        conn.rollback()
        task_id = client.insert_task(process="autobegun")
        assert conn.in_transaction()
        conn.rollback()
    # the ORM's flushes and the client's inserts through libpq; the one
    # outside a transaction through conn.execute, which autobegins
    assert len(opened) == 1
    assert _count(engine, app) == 2
    with pytest.raises(Exception, match="No row was found"):
        _row(engine, app, task_id)


@postgresql_only
def test_insert_task_on_psycopg_keeps_the_engines_isolation_level(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _cursors_opened(monkeypatch)
    serializable = engine.execution_options(isolation_level="SERIALIZABLE")
    with serializable.connect() as conn, conn.begin():
        QueueClient(conn, app.Task).insert_task(process="p")
        level = conn.exec_driver_sql("SHOW transaction_isolation").scalar_one()
    assert level == "serializable"  # psycopg's BEGIN, not a plain one
    assert opened  # the cursor ran the INSERT


@postgresql_only
def test_insert_task_on_psycopg_server_errors_are_sqlalchemy_errors(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = app.Task.__table__.name
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"ALTER TABLE {table} ADD CONSTRAINT no_forbidden CHECK (processo <> 'forbidden')"
        )
    opened = _cursors_opened(monkeypatch)
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        conn.begin()
        with pytest.raises(DBAPIError, match="no_forbidden") as info:
            client.insert_task(process="forbidden", payload={"n": 1})
        assert type(info.value).__name__ == "IntegrityError"
        assert not info.value.connection_invalidated
        assert opened == []  # libpq's error, as psycopg's
        with pytest.raises(DBAPIError, match="current transaction is aborted"):
            client.insert_task(process="refused")  # left to psycopg
        conn.rollback()
        with conn.begin():
            task_id = client.insert_task(process="after")
    assert len(opened) == 1
    assert _row(engine, app, task_id)["processo"] == "after"
    assert _count(engine, app) == 1


@postgresql_only
@pytest.mark.parametrize("in_transaction", [False, True], ids=["idle", "in-transaction"])
def test_insert_task_on_psycopg_on_a_dead_connection_invalidates_it(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch, in_transaction: bool
) -> None:
    with engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.commit()
        conn.begin()
        if in_transaction:
            conn.exec_driver_sql("SELECT 1")
        with engine.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
        opened = _cursors_opened(monkeypatch)
        with pytest.raises(DBAPIError) as info:
            QueueClient(conn, app.Task).insert_task(process="p")
        assert opened == []  # libpq's BEGIN or INSERT met the closed connection
        assert info.value.connection_invalidated
        assert conn.invalidated
        conn.rollback()
        with conn.begin():  # a new connection from the pool
            task_id = QueueClient(conn, app.Task).insert_task(process="again")
    assert _row(engine, app, task_id)["processo"] == "again"


def _prepared_here(conn: Connection) -> list[str]:
    return list(
        conn.exec_driver_sql(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'sqlaq%%'"
        ).scalars()
    )


@postgresql_only
def test_insert_task_on_psycopg_prepares_its_statement_once_and_again_when_lost(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        with conn.begin():
            client.insert_task(process="first")
        with conn.begin():
            client.insert_task(process="second")
        assert len(_prepared_here(conn)) == 1
        conn.commit()
        driver = conn.connection.dbapi_connection
        assert driver is not None
        driver.autocommit = True  # DISCARD ALL runs outside a transaction only
        driver.execute("DISCARD ALL")  # the server forgets it
        driver.autocommit = False
        opened = _cursors_opened(monkeypatch)
        with conn.begin():  # prepared again, in the same round trips
            client.insert_task(process="after discard")
        assert opened == []
        with conn.begin():
            conn.exec_driver_sql("DEALLOCATE ALL")
            with pytest.raises(DBAPIError, match="does not exist"):
                client.insert_task(process="lost")  # in a transaction it did not begin
        with conn.begin():
            client.insert_task(process="after deallocate")
        assert len(_prepared_here(conn)) == 1
    with engine.connect() as conn:
        processes = conn.execute(select(app.Task.process).order_by(app.Task.id)).scalars()
        assert list(processes) == ["first", "second", "after discard", "after deallocate"]


@postgresql_only
def test_insert_task_on_psycopg_follows_psycopgs_own_deallocations(
    db_url: str, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # psycopg sends DEALLOCATE ALL when it rolls back a transaction while it
    # holds prepared statements of its own (prepare_threshold=0: from the first)
    with created_engine(db_url, app.Base.metadata, connect_args={"prepare_threshold": 0}) as engine:
        opened = _cursors_opened(monkeypatch)
        with engine.connect() as conn:
            client = QueueClient(conn, app.Task)
            for process in ("a", "b", "c"):
                conn.exec_driver_sql("SELECT 1")  # psycopg's own prepared statement
                client.insert_task(process=process)  # in the transaction: no BEGIN here
                conn.rollback()  # psycopg deallocates everything, ours too
            with conn.begin():
                conn.exec_driver_sql("SELECT 1")
                client.insert_task(process="kept")
        assert len(opened) == 4  # the SELECTs
        assert _count(engine, app) == 1


@postgresql_only
def test_insert_task_on_psycopg_prepares_again_after_a_failed_prepare(
    engine: Engine, app: App
) -> None:
    app.Task.__table__.drop(engine)
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        with pytest.raises(DBAPIError, match="does not exist"), conn.begin():
            client.insert_task(process="no table yet")  # its PREPARE fails
        app.Task.__table__.create(conn)
        conn.commit()
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")  # in the caller's transaction: no second chance
            client.insert_task(process="prepared now")
    assert _count(engine, app) == 1


@postgresql_only
def test_insert_task_on_psycopg_prepares_nothing_where_psycopg_does_not(
    db_url: str, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # prepare_threshold=None: what PgBouncer's transaction pooling needs
    with created_engine(
        db_url, app.Base.metadata, connect_args={"prepare_threshold": None}
    ) as engine:
        opened = _cursors_opened(monkeypatch)
        with engine.connect() as conn:
            for process in ("a", "b"):
                with conn.begin():
                    QueueClient(conn, app.Task).insert_task(process=process)
            assert opened == []
            assert _prepared_here(conn) == []
        assert _count(engine, app) == 2


@postgresql_only
def test_insert_task_on_psycopg_leaves_a_nul_character_to_psycopg(engine: Engine, app: App) -> None:
    with engine.connect() as conn, pytest.raises(DBAPIError, match="NUL"):
        QueueClient(conn, app.Task).insert_task(process="p", origin="a\x00b")
    assert _count(engine, app) == 0


def test_insert_task_applies_python_defaults(tmp_path: Any, table_name: str) -> None:
    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table_name
        constant: Mapped[str] = mapped_column(String(10), default="fixed")

    class Computed(QueueMixin, Base):
        __tablename__ = table_name + "_c"
        computed: Mapped[str] = mapped_column(String(40), default=lambda: "from a callable")

    engine = create_engine(f"sqlite:///{tmp_path / 'defaults.db'}")
    Base.metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            constant_id = QueueClient(conn, Task).insert_task(process="p")
            computed_id = QueueClient(conn, Computed).insert_task(process="p")
        with engine.connect() as conn:
            constant = conn.execute(select(Task.constant).where(Task.id == constant_id))
            computed = conn.execute(select(Computed.computed).where(Computed.id == computed_id))
            assert (constant.scalar_one(), computed.scalar_one()) == ("fixed", "from a callable")
    finally:
        engine.dispose()


def test_insert_tasks_over_the_copy_threshold(engine: Engine, app: App) -> None:
    count = PostgresAdapter.COPY_THRESHOLD + 6
    future = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    tasks: list[dict[str, Any]] = [
        {
            "process": "p",
            "external_key": str(i) if i % 2 else None,
            "payload": {"i": i} if i % 5 else None,
            **({"run_at": future} if i % 7 == 3 else {}),
        }
        for i in range(count)
    ]
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(tasks)
    rows = [_row(engine, app, task_id) for task_id in ids]
    assert len(set(ids)) == count
    assert [
        (r["chave_externa"], r["payload"], r["status"], r["tenant"], r["prioridade"]) for r in rows
    ] == [
        (
            str(i) if i % 2 else None,
            f'{{"i": {i}}}' if i % 5 else None,
            "agendada" if i % 7 == 3 else "pendente",
            None,
            50,
        )
        for i in range(count)
    ]
    assert [r["payload_hash"] is None for r in rows] == [i % 5 == 0 for i in range(count)]


@postgresql_only
def test_insert_tasks_uses_copy_only_when_unobserved(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied: list[int] = []
    original = PostgresAdapter.task_copy_many

    def spy(self: PostgresAdapter, conn: Connection, *, rows: Any) -> list[int]:
        copied.append(len(rows))
        return original(self, conn, rows=rows)

    monkeypatch.setattr(PostgresAdapter, "task_copy_many", spy)
    threshold = PostgresAdapter.COPY_THRESHOLD
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        client.insert_tasks([{"process": "small"}] * (threshold - 1))
        client.insert_tasks([{"process": "big"}] * threshold)
        event.listen(conn, "before_cursor_execute", lambda *args: None)
        client.insert_tasks([{"process": "watched"}] * threshold)
    assert copied == [threshold]
    assert _count(engine, app) == 3 * threshold - 1


# ------------------------------------------------- list_equivalent_task
def test_dict_payload_and_its_json_text_find_each_other(engine: Engine, app: App) -> None:
    # JSON text built by the caller (nsj-queue-lib code's json.dumps(d)) is
    # given as JsonText; a plain str is a string value (see test_payload.py)
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        from_dict = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        from_text = client.insert_task("erp", "sefaz", "faturar", "8", JsonText('{"invoice": 8}'))
    with Session(engine) as s:
        client = QueueClient(s, app.Task)
        found = client.list_equivalent_task(
            "erp", "sefaz", "faturar", "7", JsonText('{"invoice": 7}')
        )
        assert [r.id for r in found] == [from_dict]
        found = client.list_equivalent_task("erp", "sefaz", "faturar", "8", {"invoice": 8})
        assert [r.id for r in found] == [from_text]
        [record] = found
        assert isinstance(record, TaskRecord)
        assert (record.payload, record["chave_externa"], record.status) == (
            {"invoice": 8},
            "8",
            "pendente",
        )
        # the same text as a plain str is another payload: a string
        assert client.list_equivalent_task("erp", "sefaz", "faturar", "8", '{"invoice": 8}') == []


def test_equivalent_task_must_match_every_key(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        task_id = QueueClient(s, app.Task).insert_task(
            "erp", "sefaz", "faturar", "7", {"invoice": 7}
        )
    with Session(engine) as s:
        client = QueueClient(s, app.Task)
        same = ("erp", "sefaz", "faturar", "7", {"invoice": 7})
        assert [r.id for r in client.list_equivalent_task(*same)] == [task_id]
        for position, other in enumerate(["crm", "nfe", "cancelar", "70", {"invoice": 70}]):
            args = list(same)
            args[position] = other
            assert client.list_equivalent_task(*args) == [], args
        # the text must be the same: other separators hash differently
        assert client.list_equivalent_task("erp", "sefaz", "faturar", "7", '{"invoice":7}') == []
        assert client.list_equivalent_task("erp", "sefaz", "faturar", "7", None) == []


def test_equivalent_task_respects_the_status_filter(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        failed = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        pending = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        s.execute(update(app.Task).where(app.Task.id == failed).values(status="falha"))
    with Session(engine) as s:
        client = QueueClient(s, app.Task)
        args = ("erp", "sefaz", "faturar", "7", {"invoice": 7})
        assert [r.id for r in client.list_equivalent_task(*args)] == [pending]
        assert [r.id for r in client.list_equivalent_task(*args, status=["falha"])] == [failed]
        assert [r.id for r in client.list_equivalent_task(*args, status=["falha", "pendente"])] == [
            failed,
            pending,
        ]
        assert client.list_equivalent_task(*args, status=["sucesso"]) == []


def test_equivalent_task_finds_running_tasks_too(engine: Engine, app: App) -> None:
    # running tasks are outside ix_equivalente (see equivalence_criteria):
    # asking for them still finds them, beside the other statuses
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        running = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        done = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        pending = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 8})
        s.execute(update(app.Task).where(app.Task.id == running).values(status="processando"))
        s.execute(update(app.Task).where(app.Task.id == done).values(status="sucesso"))
    with Session(engine) as s:
        client = QueueClient(s, app.Task)
        args = ("erp", "sefaz", "faturar", "7", {"invoice": 7})
        assert [r.id for r in client.list_equivalent_task(*args)] == [done, pending]
        assert [r.id for r in client.list_equivalent_task(*args, status="processando")] == [running]
        every = ["pendente", "processando", "sucesso", "processando"]
        assert [r.id for r in client.list_equivalent_task(*args, status=every)] == [
            running,
            done,
            pending,
        ]
        assert client.list_equivalent_task(*args, status=[]) == []


def test_equivalent_task_none_tenant_matches_only_null(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        args = ("erp", "sefaz", "faturar", "7", {"invoice": 7})
        no_tenant = client.insert_task(*args)
        tenant_7 = client.insert_task(*args, tenant=7)
        tenant_7_g1 = client.insert_task(*args, tenant=7, grupo_empresarial="G1")
        no_tenant_g1 = client.insert_task(*args, company_group="G1")
    with Session(engine) as s:
        client = QueueClient(s, app.Task)

        def found(**kwargs: Any) -> list[int]:
            return [r.id for r in client.list_equivalent_task(*args, **kwargs)]

        assert found() == [no_tenant]
        assert found(tenant=None, grupo_empresarial=None) == [no_tenant]
        assert found(tenant=7) == [tenant_7]
        assert found(tenant=7, grupo_empresarial="G1") == [tenant_7_g1]
        assert found(company_group="G1") == [no_tenant_g1]
        assert found(tenant=8) == []


# ----------------------------------------------------------- the table
def test_table_given_as_a_string(engine: Engine, app: App, table_name: str) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, table_name)
        assert client.table.name == table_name
        task_id = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        found = client.list_equivalent_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
    assert [r.id for r in found] == [task_id]
    assert _row(engine, app, task_id)["payload"] == '{"invoice": 7}'


@sqlite_only
def test_table_given_as_a_table_object(engine: Engine, app: App) -> None:
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task.__table__)
        assert client.table is app.Task.__table__
        task_id = client.insert_task(process="p", payload={"k": 1})
    assert _row(engine, app, task_id)["processo"] == "p"


@pytest.fixture
def pg_schema() -> Iterator[tuple[Engine, str]]:
    engine = create_engine(server_url("postgresql"))
    schema = f"sqlaq_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield engine, schema
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.mark.postgresql
def test_schema_qualified_table_on_postgresql(
    pg_schema: tuple[Engine, str], table_name: str
) -> None:
    engine, schema = pg_schema

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table_name
        __table_args__ = {"schema": schema}  # noqa: RUF012

    Base.metadata.create_all(engine)
    with Session(engine) as s, s.begin():
        client = QueueClient(s, f"{schema}.{table_name}")
        assert (client.table.schema, client.table.name) == (schema, table_name)
        by_name = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
        by_model = QueueClient(s, Task).insert_task("erp", "sefaz", "faturar", "8", {"invoice": 8})
        found = client.list_equivalent_task("erp", "sefaz", "faturar", "7", {"invoice": 7})
    assert [r.id for r in found] == [by_name]
    with engine.connect() as conn:
        rows = conn.execute(
            text(f'SELECT id, chave_externa, status FROM "{schema}"."{table_name}" ORDER BY id')
        ).all()
        # nothing went to a same-named table elsewhere on the search path
        elsewhere = conn.execute(
            text(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_name = :t AND table_schema <> :s"
            ),
            {"t": table_name, "s": schema},
        ).scalar_one()
    assert [tuple(r) for r in rows] == [(by_name, "7", "pendente"), (by_model, "8", "pendente")]
    assert elsewhere == 0


# ---------------------------------------------------- the connection
@sqlite_only
def test_raw_dbapi_connection_is_refused(engine: Engine, app: App) -> None:
    raw = engine.raw_connection()
    plain = sqlite3.connect(":memory:")
    try:
        for candidate in (raw, raw.driver_connection, plain):
            with pytest.raises(ConfigurationError) as info:
                QueueClient(candidate, app.Task)  # type: ignore[arg-type]
            assert str(info.value).startswith(
                "QueueClient needs a SQLAlchemy Session or Connection, not "
            )
    finally:
        raw.close()
        plain.close()


@pytest.mark.postgresql
def test_raw_psycopg_connection_is_refused(app: App) -> None:
    engine = create_engine(server_url("postgresql"))
    raw = engine.raw_connection()
    try:
        with pytest.raises(ConfigurationError, match="needs a SQLAlchemy Session or Connection"):
            QueueClient(raw.driver_connection, app.Task)  # type: ignore[arg-type]
    finally:
        raw.close()
        engine.dispose()


def test_refused_connection_message_names_its_module() -> None:
    plain = sqlite3.connect(":memory:")
    try:
        with pytest.raises(ConfigurationError, match=r"not sqlite3\.Connection"):
            QueueClient(plain, "fila")  # type: ignore[arg-type]
    finally:
        plain.close()


def test_constructor_takes_the_issue_names_and_the_seed_names(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        by_contract = QueueClient(
            session_or_connection=s, table=app.Task, subscriber_table="public.inscricoes"
        )
        by_seed = QueueClient(
            bd_conn=s, queue_table=app.Task, queue_subscriber_table="public.inscricoes"
        )
        positional = QueueClient(s, app.Task, "public.inscricoes")
        for client in (by_contract, by_seed, positional):
            assert client.bd_conn is s and client.session_or_connection is s
            assert client.table is app.Task.__table__
            assert client.subscriber_table == "public.inscricoes"
        first = by_seed.insert_task(None, None, "p", "k", {"n": 1})
        second = by_contract.insert_task(None, None, "p", "k", {"n": 2})
    assert second > first


def test_constructor_refuses_a_parameter_given_by_both_names(engine: Engine, app: App) -> None:
    with Session(engine) as s:
        with pytest.raises(TypeError, match="both table and queue_table"):
            QueueClient(s, app.Task, queue_table=app.Task)
        with pytest.raises(TypeError, match="both session_or_connection and bd_conn"):
            QueueClient(s, app.Task, bd_conn=s)
        with pytest.raises(TypeError, match="needs a Session or Connection and a queue table"):
            QueueClient(s)


def test_a_libpq_row_plan_runs_the_bind_processors_that_can_change_a_value() -> None:
    """A plan skips a processor only where a value of exactly its column's
    Python type passes unchanged (SQLAlchemy's own types, PayloadHash); a
    TypeDecorator's runs on every value."""
    from sqlalchemy import Boolean, TypeDecorator

    from sqla_queue.adapters import libpq
    from sqla_queue.common.types import PayloadHash

    class Shouting(TypeDecorator[str]):
        impl = String
        cache_ok = True

    calls: list[str] = []

    def processor(name: str, result: Any) -> Any:
        def process(value: Any) -> Any:
            calls.append(name)
            return result(value)

        return process

    plan = libpq.row_plan(
        "INSERT INTO t (a, b, c, d) VALUES (%(a)s, %(b)s, %(c)s, %(d)s) RETURNING t.id",
        {"d": True},
        {
            "a": processor("a", str.upper),
            "b": processor("b", lambda v: v),
            "c": processor("c", lambda v: v),
            "d": processor("d", lambda v: v),
        },
        {"a": Shouting(), "b": Boolean(), "c": PayloadHash(), "d": Boolean()},
    )
    assert plan is not None
    assert plan.statement.sql == (
        b"INSERT INTO t (a, b, c, d) VALUES ($1, $2, $3, $4) RETURNING t.id"
    )
    assert plan.values({"a": "quiet", "b": False, "c": b"0f"}) == ["QUIET", False, b"0f", True]
    assert calls == ["a"]
    # not exactly the column's type (or None): the processor decides
    given = {"a": "x", "b": 1, "c": bytearray(b"0f")}
    assert plan.values(given) == ["X", 1, bytearray(b"0f"), True]
    assert calls == ["a", "a", "b", "c"]
