"""SingleStore: what can be tested without a SingleStore server, and what cannot.

There is no SingleStore server on these machines and none can be installed.
What runs here:

- the DDL, compiled with the sqlalchemy-singlestoredb dialect and checked
  (a rowstore table, a shard key that every unique key contains);
- the URL handling: ``DB_DRIVER=SINGLE_STORE``, and the dialect's own URL
  round trip, which breaks on a "/" in the password (worked around);
- the SingleStore adapter (conditional-update claims, leases only, no
  GET_LOCK) through the ``singlestoredb`` driver and dialect against MariaDB
  over the MySQL protocol: claims raced by two connections, the retry chain,
  rollback of a failed handler (the driver's autocommit, worked around), and
  a worker in client-server mode with a real queue server process.

The tests marked ``singlestore`` need a real server and run only where
SQLA_QUEUE_TEST_SINGLESTORE_URL names one; they have not been run here.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, Table, UniqueConstraint, create_engine, make_url, select, text
from sqlalchemy.schema import CreateTable
from sqlalchemy_singlestoredb import dialect as SingleStoreDialect

from sqla_queue import QueueClient
from sqla_queue.adapters.singlestore import SingleStoreAdapter
from sqla_queue.common.ddl_singlestore import SHARD_KEY_COLUMNS
from sqla_queue.common.exceptions import UnsupportedOperationError
from sqla_queue.config.settings import (
    ServerSettings,
    Settings,
    database_url,
    engine_options,
    normalize_url,
)
from sqla_queue.worker import Runner
from tests.conftest import run_cli, server_url, spawn_cli, wait_until
from tests.support import pubsub_app
from tests.support.app import App, build
from tests.support.queue_server import SECRET, running_server

SINGLESTORE_URL = os.environ.get("SQLA_QUEUE_TEST_SINGLESTORE_URL")
needs_singlestore = pytest.mark.skipif(
    not SINGLESTORE_URL,
    reason="no SingleStore server: set SQLA_QUEUE_TEST_SINGLESTORE_URL=singlestoredb://…",
)
CLIENT_SERVER = Settings(server=ServerSettings(enabled=True, secret=SECRET))


# --------------------------------------------------------------------- DDL
def _unique_column_sets(table: Table) -> list[set[str]]:
    sets = [{c.name for c in table.primary_key.columns}]
    sets += [
        {c.name for c in constraint.columns}
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    ]
    sets += [{c.name for c in index.columns} for index in table.indexes if index.unique]
    return sets


@pytest.mark.parametrize("which", ["queue", "subscribers"])
def test_tables_are_rowstore_sharded_by_a_key_every_unique_key_contains(
    table_name: str, which: str
) -> None:
    """Compiled only: no SingleStore server ran this DDL."""
    app = pubsub_app.build(table_name)
    table = app.Task.__table__ if which == "queue" else app.Subscriber.__table__
    ddl = str(CreateTable(table).compile(dialect=SingleStoreDialect()))
    assert ddl.strip().startswith(f"CREATE ROWSTORE TABLE {table.name} (")
    assert "SHARD KEY (id)" in ddl
    for columns in _unique_column_sets(table):
        assert set(SHARD_KEY_COLUMNS) <= columns, columns
    if which == "subscribers":
        assert "headers JSON" in ddl
    else:
        assert "payload LONGTEXT" in ddl  # any text, as the seed's payloads are


def test_application_tables_and_options_are_left_alone(table_name: str) -> None:
    from sqlalchemy_singlestoredb import ShardKey

    app = build(table_name)
    effect = str(CreateTable(app.Effect.__table__).compile(dialect=SingleStoreDialect()))
    assert effect.strip().startswith(f"CREATE TABLE {table_name}_effect (")
    assert "SHARD KEY" not in effect
    table = app.Task.__table__
    table.dialect_options["singlestoredb"]["shard_key"] = ShardKey("id", index_type="HASH")
    ddl = str(CreateTable(table).compile(dialect=SingleStoreDialect()))
    assert "SHARD KEY USING HASH (id)" in ddl


# --------------------------------------------------------------------- URLs
def test_db_driver_single_store_builds_a_singlestoredb_url() -> None:
    env = {
        "DB_DRIVER": "single_store",
        "DB_HOST": "db.example",
        "DB_PORT": "3307",
        "DB_BASE": "queues",
        "DB_USER": "u",
        "DB_PASS": "p@ss:w/rd%",
    }
    url = database_url(env)
    assert url is not None
    assert (url.drivername, url.host, url.port, url.database) == (
        "singlestoredb",
        "db.example",
        3307,
        "queues",
    )
    assert (url.username, url.password) == ("u", "p@ss:w/rd%")
    bare, connect_args = engine_options(url)
    assert bare.password is None
    assert connect_args == {"password": "p@ss:w/rd%"}
    engine = create_engine(bare, connect_args=connect_args)
    _, params = engine.dialect.create_connect_args(bare)
    assert (params["host"], params["port"], params["user"], params["database"]) == (
        "db.example",
        3307,
        "u",
        "queues",
    )
    # what sqla-queue works around: the dialect cannot read such a URL back
    with pytest.raises(ValueError, match="Port could not be cast"):
        create_engine(url)


@pytest.fixture
def mariadb_user() -> Iterator[tuple[str, str]]:
    """A MariaDB user whose password holds every character that URLs quote."""
    name, password = f"sqlaq_{uuid.uuid4().hex[:8]}", "p@ss:w/rd%?#"
    admin = create_engine(server_url("mysql"))
    database = admin.url.database
    with admin.begin() as conn:
        conn.execute(text(f"CREATE USER '{name}'@'%' IDENTIFIED BY :pw"), {"pw": password})
        conn.execute(text(f"GRANT ALL ON `{database}`.* TO '{name}'@'%'"))
    try:
        yield name, password
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP USER '{name}'@'%'"))
        admin.dispose()


def test_single_store_driver_connects_with_any_password_over_the_mysql_protocol(
    mariadb_user: tuple[str, str],
) -> None:
    """The singlestoredb driver against MariaDB: the password reaches it whole."""
    name, password = mariadb_user
    server = make_url(server_url("mysql"))
    env = {
        "DB_DRIVER": "SINGLE_STORE",
        "DB_HOST": str(server.host),
        "DB_PORT": str(server.port or 3306),
        "DB_BASE": str(server.database),
    }
    url = database_url({**env, "DB_USER": name, "DB_PASS": password})
    assert url is not None
    bare, connect_args = engine_options(url)
    engine = create_engine(bare, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            assert conn.dialect.name == "singlestoredb"
            assert conn.execute(text("SELECT CURRENT_USER()")).scalar().startswith(name)
    finally:
        engine.dispose()


# --------------------------------------------------------------------- the adapter on MariaDB
@pytest.fixture
def mariadb_app(table_name: str) -> Iterator[App]:
    """The test app's tables on MariaDB (made with PyMySQL: MariaDB would
    refuse SingleStore's ROWSTORE and SHARD KEY)."""
    app = build(table_name)
    engine = create_engine(server_url("mysql"))
    app.Base.metadata.create_all(engine)
    try:
        yield app
    finally:
        app.Base.metadata.drop_all(engine)
        engine.dispose()


def _singlestore_driver_url() -> str:
    """The MariaDB test server's URL with the singlestoredb dialect and driver."""
    url = normalize_url(server_url("mysql")).set(drivername="singlestoredb")
    return url.render_as_string(hide_password=False)


@pytest.fixture
def ss_engine(mariadb_app: App) -> Iterator[Engine]:
    """The singlestoredb dialect and driver, on MariaDB."""
    engine = create_engine(_singlestore_driver_url())
    try:
        yield engine
    finally:
        engine.dispose()


def _insert(engine: Engine, app: App, payloads: list[Any]) -> list[int]:
    with engine.begin() as conn:
        return QueueClient(conn, app.Task).insert_tasks(
            {"process": "ss", "payload": payload} for payload in payloads
        )


def _statuses(engine: Engine, app: App) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(app.Task.id, app.Task.status)).all())


def test_conditional_claims_racing_through_the_singlestoredb_driver_never_share_a_row(
    mariadb_app: App, ss_engine: Engine
) -> None:
    """Two connections, and two lanes of one worker (same worker id): the
    per-claim token tells their wins apart."""
    app = mariadb_app
    table = app.Task.__table__
    adapter = SingleStoreAdapter(table, table.name)
    adapter.prepare_engine(ss_engine)
    ids = _insert(ss_engine, app, [{"n": n} for n in range(300)])
    claimed: dict[int, list[int]] = {0: [], 1: []}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def claim_all(lane: int) -> None:
        try:
            with adapter.connect_claim(ss_engine) as conn:
                start.wait(timeout=10)
                while True:
                    with conn.begin():
                        got = adapter.task_claim_many(
                            conn, limit=7, owner="same-worker", lease_seconds=30
                        )
                    claimed[lane].extend(task.id for task in got)
                    if not got and "pendente" not in _statuses(ss_engine, app).values():
                        return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim_all, args=(lane,)) for lane in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert not set(claimed[0]) & set(claimed[1])
    assert sorted(claimed[0] + claimed[1]) == ids
    with ss_engine.connect() as conn:
        owners = set(conn.execute(select(table.c.worker_id)).scalars())
    assert owners == {"same-worker"}  # no claim token left behind
    with ss_engine.connect() as conn, pytest.raises(UnsupportedOperationError, match="server"):
        adapter.lock_try(conn, key=1)


def test_failed_attempts_roll_back_through_the_singlestoredb_driver(
    mariadb_app: App, ss_engine: Engine
) -> None:
    """The driver opens connections in autocommit mode; the adapter turns it
    off, or the failed attempts' writes would stay."""
    app = mariadb_app
    [first] = _insert(ss_engine, app, [{"fail": "always"}])
    worker = app.FailingWorker()  # max_retry 3, writes its Effect, then fails
    assert (
        Runner.for_worker(worker, engine=ss_engine, burst=True, settings=CLIENT_SERVER).run() == 0
    )
    with ss_engine.connect() as conn:
        rows = conn.execute(
            select(app.Task.attempt, app.Task.dead, app.Task.status).order_by(app.Task.id)
        ).all()
        notes = conn.execute(select(app.Effect.note)).scalars().all()
    assert [tuple(row) for row in rows] == [
        (1, False, "falha"),
        (2, False, "falha"),
        (3, False, "falha"),
        (1, True, "sucesso"),
    ]
    assert notes == ["dead"]  # "should vanish" rolled back three times
    assert first == min(_statuses(ss_engine, app))


def test_singlestore_worker_without_the_server_refuses_to_start(mariadb_app: App) -> None:
    url = _singlestore_driver_url()
    env = {"SQLA_QUEUE_TEST_TABLE": mariadb_app.Task.__table__.name, "CLIENT_SERVER_MODE": ""}
    proc = run_cli(
        "worker", "tests.support.app:RecordingWorker", "--url", url, env=env, check=False
    )
    assert proc.returncode == 1
    assert "Error: SingleStore needs the queue server" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_singlestore_worker_in_client_server_mode_with_a_real_server(
    mariadb_app: App, ss_engine: Engine
) -> None:
    app = mariadb_app
    table = app.Task.__table__.name
    url = ss_engine.url.render_as_string(hide_password=False)
    with running_server("tests.support.app:RecordingWorker", url, table) as server:
        env = {"SQLA_QUEUE_TEST_TABLE": table, **server.env(SQLA_QUEUE_POLL_INTERVAL="3600")}
        worker = spawn_cli("worker", "tests.support.app:RecordingWorker", "--url", url, env=env)
        try:
            ids = _insert(ss_engine, app, [{"n": n} for n in range(50)])
            wait_until(
                lambda: set(_statuses(ss_engine, app).values()) == {"sucesso"},
                timeout=60,
                message="the server to wake the worker and every task to run",
            )
        finally:
            worker.terminate()
            output = worker.communicate(timeout=30)[0]
        assert worker.returncode == 0, output
    with ss_engine.connect() as conn:
        done = conn.execute(select(app.Effect.task_id)).scalars().all()
    assert sorted(done) == ids


# --------------------------------------------------------------------- a real SingleStore
@pytest.fixture
def singlestore(table_name: str) -> Iterator[tuple[Engine, App]]:
    assert SINGLESTORE_URL is not None
    app = build(table_name)
    bare, connect_args = engine_options(database_url({"SQLA_QUEUE_URL": SINGLESTORE_URL}))  # type: ignore[arg-type]
    engine = create_engine(bare, connect_args=connect_args)
    app.Base.metadata.create_all(engine)
    try:
        yield engine, app
    finally:
        app.Base.metadata.drop_all(engine)
        engine.dispose()


@needs_singlestore
def test_real_singlestore_runs_the_ddl_and_the_claim(singlestore: tuple[Engine, App]) -> None:
    """Not run here (no SingleStore server): the DDL as created on a real
    server, and the conditional claim raced by two connections."""
    engine, app = singlestore
    table = app.Task.__table__
    adapter = SingleStoreAdapter(table, table.name)
    adapter.prepare_engine(engine)
    ids = _insert(engine, app, [{"n": n} for n in range(50)])
    with adapter.connect_claim(engine) as a, adapter.connect_claim(engine) as b:
        with a.begin():
            first = adapter.task_claim_many(a, limit=30, owner="a", lease_seconds=30)
        with b.begin():
            second = adapter.task_claim_many(b, limit=30, owner="b", lease_seconds=30)
    assert sorted(t.id for t in first + second) == ids
    assert not {t.id for t in first} & {t.id for t in second}


@needs_singlestore
def test_real_singlestore_worker_runs_the_retry_chain(singlestore: tuple[Engine, App]) -> None:
    """Not run here (no SingleStore server)."""
    engine, app = singlestore
    _insert(engine, app, [{"n": 1}, {"fail": "x"}])
    worker = app.FailingWorker()
    assert Runner.for_worker(worker, engine=engine, burst=True, settings=CLIENT_SERVER).run() == 0
    with engine.connect() as conn:
        notes = conn.execute(select(app.Effect.note)).scalars().all()
    assert sorted(notes) == ["dead", "dead"]
