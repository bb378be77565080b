"""The fixtures of tests/support/servers.py: PgBouncer, a private PostgreSQL, a private MariaDB.

Besides checking the fixtures, these tests pin down what PgBouncer's
transaction pooling does to session state, which the queue's design has to
live with: a session advisory lock belongs to a server connection that other
clients share and that outlives its client, and psycopg's automatic prepared
statements run on whatever server connection the next transaction gets.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from tests.conftest import server_url
from tests.support.servers import PgBouncer, PrivateMariaDB, PrivatePostgres, poll, require_binary

pytestmark = pytest.mark.servers


def _lock_key() -> int:
    """An advisory lock key no other suite on the shared server uses."""
    return random.randint(1, 2**62)


def _one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


# --------------------------------------------------------------------- PgBouncer
def test_a_query_runs_through_pgbouncer_in_transaction_mode(
    pgbouncer_transaction: PgBouncer, pgbouncer_transaction_url: str
) -> None:
    assert pgbouncer_transaction_url == pgbouncer_transaction.url
    assert pgbouncer_transaction.connect_args == {"prepare_threshold": None}
    engine = pgbouncer_transaction.engine()
    try:
        for _ in range(10):  # past psycopg's prepare_threshold (5)
            with engine.connect() as conn:
                port, database, prepared = conn.execute(
                    text(
                        "SELECT inet_server_port(), current_database(), "
                        "(SELECT count(*) FROM pg_prepared_statements)"
                    )
                ).one()
                conn.commit()
        assert (port, database) == (
            pgbouncer_transaction.upstream["port"],
            pgbouncer_transaction.upstream["dbname"],
        )
        assert prepared == 0
    finally:
        engine.dispose()
    pools = pgbouncer_transaction.admin("SHOW POOLS")
    upstream = pgbouncer_transaction.upstream["dbname"]
    assert [row[0] for row in pools if row[0] != "pgbouncer"] == [upstream]
    assert pools[-1][-1] == "transaction"  # pool_mode, the last column


def test_a_query_runs_through_pgbouncer_in_session_mode(pgbouncer_session: PgBouncer) -> None:
    """Session pooling keeps a client on one server connection: SET sticks."""
    assert pgbouncer_session.connect_args == {}
    with pgbouncer_session.connect() as conn:
        first = _one(conn, "SELECT pg_backend_pid()")
        conn.execute("SET application_name = 'sqlaq-session'")
        assert _one(conn, "SELECT pg_backend_pid()") == first
        assert _one(conn, "SHOW application_name") == "sqlaq-session"


def test_advisory_lock_is_shared_by_clients_behind_transaction_pooling(
    pgbouncer_factory: Callable[..., PgBouncer],
) -> None:
    """Behind transaction pooling a session advisory lock belongs to a server
    connection, not to the client that took it: another client on that server
    connection takes it too (the lock is re-entrant), and it outlives its
    client. So a held advisory lock cannot prove that a worker is alive."""
    bouncer = pgbouncer_factory("transaction", pool_size=1)
    key = _lock_key()
    direct = psycopg.connect(
        make_conninfo(server_url("postgresql")), autocommit=True, connect_timeout=5
    )
    try:
        with bouncer.connect() as a, bouncer.connect() as b:
            a_pid = _one(a, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(%s)) l", (key,))
            b_got, b_pid = _one(b, "SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (key,))
            assert (b_got, b_pid) == (True, a_pid)
        # both clients are gone; their server connection, and the lock, are not
        assert _one(direct, "SELECT pg_try_advisory_lock(%s)", (key,)) is False
        with bouncer.connect() as c:
            assert _one(c, "SELECT pg_try_advisory_lock(%s)", (key,)) is True
            c.execute("SELECT pg_advisory_unlock_all()")
        assert _one(direct, "SELECT pg_try_advisory_lock(%s)", (key,)) is True
    finally:
        direct.close()


def test_advisory_lock_excludes_other_clients_behind_session_pooling(
    pgbouncer_session: PgBouncer,
) -> None:
    key = _lock_key()
    with pgbouncer_session.connect() as a, pgbouncer_session.connect() as b:
        a.execute("SELECT pg_advisory_lock(%s)", (key,))
        assert _one(b, "SELECT pg_try_advisory_lock(%s)", (key,)) is False
    # PgBouncer runs DISCARD ALL on a's server connection after a leaves,
    # which frees the lock: soon after, not before the disconnection returns
    with pgbouncer_session.connect() as c:
        poll(
            lambda: _one(c, "SELECT pg_try_advisory_lock(%s)", (key,)),
            "DISCARD ALL to free the lock",
            timeout=10,
        )


def make_conninfo(url: str) -> str:
    parsed = create_engine(url).url
    parts: dict[str, Any] = {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
        "dbname": parsed.database,
        "user": parsed.username,
        "password": parsed.password,
    }
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in parts.items() if v is not None})


QUERY_C = "SELECT CAST(:n AS int) + 1 AS c_query"
QUERY_D = "SELECT CAST(:n AS int) * 100 AS d_query"


@pytest.mark.parametrize(
    ("connect_args", "expected"),
    [
        pytest.param({}, (700, "d_query"), id="psycopg-default"),
        pytest.param({"prepare_threshold": None}, (8, "c_query"), id="prepare_threshold-None"),
    ],
)
def test_default_prepare_threshold_runs_another_clients_statement(
    pgbouncer_factory: Callable[..., PgBouncer],
    connect_args: dict[str, Any],
    expected: tuple[int, str],
) -> None:
    """psycopg names its prepared statements _pg3_0, _pg3_1… per client
    connection. PgBouncer 1.18 in transaction mode does not track them, so
    client C's seventh ``n + 1`` runs client D's ``_pg3_0`` (``n * 100``) on
    the server connection D prepared it on: a wrong answer, no error.
    ``prepare_threshold=None`` gives the right one. Deterministic: two server
    connections, which PgBouncer reuses last-in first-out."""
    bouncer = pgbouncer_factory("transaction", pool_size=2)
    engine = create_engine(bouncer.url, connect_args=connect_args)
    try:
        with engine.connect() as c, engine.connect() as d:
            for n in range(8):  # one transaction: C holds server connection 1
                c.execute(text(QUERY_C), {"n": n})
            c_server = c.execute(text("SELECT pg_backend_pid()")).scalar()
            for n in range(8):  # connection 1 is busy: D runs on connection 2
                d.execute(text(QUERY_D), {"n": n})
                d_server = d.execute(text("SELECT pg_backend_pid()")).scalar()
                d.commit()
            assert c_server != d_server
            c.commit()  # connection 1 goes back to the pool, last
            d.execute(text("SELECT 1"))  # D takes connection 1 and keeps it
            result = c.execute(text(QUERY_C), {"n": 7})  # C gets connection 2
            value = result.scalar_one()
            column = next(iter(result.keys()))
            assert c.execute(text("SELECT pg_backend_pid()")).scalar() == d_server
            assert (value, column) == expected
    finally:
        engine.dispose()


def test_prepare_threshold_cannot_go_in_the_url(pgbouncer_transaction: PgBouncer) -> None:
    """URL query values reach psycopg as strings: the first statement fails."""
    engine = create_engine(pgbouncer_transaction.url + "?prepare_threshold=None")
    try:
        with pytest.raises(TypeError, match="not supported between"), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


# --------------------------------------------------------------------- private PostgreSQL
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_private_postgres_restart_drops_connections_and_comes_back(
    private_postgres: PrivatePostgres, mode: str
) -> None:
    shared = psycopg.connect(make_conninfo(server_url("postgresql")), autocommit=True)
    try:
        shared_started = _one(shared, "SELECT pg_postmaster_start_time()")
        engine = private_postgres.engine()
        postmaster = private_postgres.pid
        with engine.connect() as conn:
            assert conn.execute(text("SELECT inet_server_port()")).scalar() == (
                private_postgres.port
            )
            private_postgres.restart(mode)
            with pytest.raises(OperationalError):
                conn.execute(text("SELECT 1"))
        assert private_postgres.pid not in (None, postmaster)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar() == "test"
        engine.dispose()
        # the shared server was not touched
        assert _one(shared, "SELECT pg_postmaster_start_time()") == shared_started
    finally:
        shared.close()


def test_private_postgres_stop_start_and_kill(private_postgres: PrivatePostgres) -> None:
    with private_postgres.connect() as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1)")
    private_postgres.stop()
    assert private_postgres.pid is None
    assert not private_postgres.accepts()
    private_postgres.start()
    survivor = private_postgres.connect()
    private_postgres.kill()
    assert private_postgres.pid is None
    assert not private_postgres.accepts()
    with pytest.raises(psycopg.OperationalError):
        survivor.execute("SELECT 1")
    survivor.close()
    private_postgres.start()
    assert "not properly shut down" in private_postgres.log_path.read_text()
    with private_postgres.connect() as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]


def test_terminate_backends_spares_the_caller(private_postgres: PrivatePostgres) -> None:
    victim = private_postgres.connect(application_name="sqlaq-victim")
    bystander = private_postgres.connect(application_name="sqlaq-bystander")
    victim_pid = _one(victim, "SELECT pg_backend_pid()")
    bystander_pid = _one(bystander, "SELECT pg_backend_pid()")
    engine = private_postgres.engine()
    try:
        with engine.connect() as caller:
            assert private_postgres.terminate_backends("sqlaq-vic%", conn=caller) == [victim_pid]
            with pytest.raises(psycopg.OperationalError):
                victim.execute("SELECT 1")
            assert _one(bystander, "SELECT 1") == 1
            assert private_postgres.terminate_backends(conn=caller) == [bystander_pid]
            with pytest.raises(psycopg.OperationalError):
                bystander.execute("SELECT 1")
            assert caller.execute(text("SELECT 1")).scalar() == 1
            # without conn, its own connection is the caller: ours is a victim
            caller_pid = caller.execute(text("SELECT pg_backend_pid()")).scalar()
            assert private_postgres.terminate_backends() == [caller_pid]
            with pytest.raises(OperationalError):
                caller.execute(text("SELECT 1"))
    finally:
        victim.close()
        bystander.close()
        engine.dispose()


def test_private_pgbouncer_clients_outlive_a_server_restart(
    private_postgres: PrivatePostgres, private_pgbouncer: PgBouncer
) -> None:
    """An idle client of PgBouncer keeps its connection across a server
    restart (PgBouncer replaces the dead server connections); a client inside
    a transaction loses its connection."""
    with private_pgbouncer.connect() as idle, private_pgbouncer.connect(autocommit=False) as busy:
        before = _one(idle, "SELECT pg_backend_pid()")
        busy.execute("SELECT 1")  # BEGIN: holds a server connection
        private_postgres.restart("fast")

        def backend() -> int | None:
            try:
                return int(_one(idle, "SELECT pg_backend_pid()"))
            except psycopg.OperationalError:
                return None

        after = poll(backend, "a query through PgBouncer after the restart", timeout=15)
        assert after != before
        assert _one(idle, "SELECT inet_server_port()") == private_postgres.port
        with pytest.raises(psycopg.OperationalError):
            busy.execute("SELECT 1")
        assert busy.closed


# --------------------------------------------------------------------- private MariaDB
def test_private_mariadb_kill_connections_restart_and_kill(private_mariadb: PrivateMariaDB) -> None:
    victim = private_mariadb.connect()
    engine = private_mariadb.engine()
    try:
        with engine.connect() as caller:
            assert caller.execute(text("SELECT @@port")).scalar() == private_mariadb.port
            assert private_mariadb.kill_connections(conn=caller) == [victim.thread_id()]
            assert caller.execute(text("SELECT 1")).scalar() == 1
            caller.execute(text("CREATE TABLE kept (n int) ENGINE=InnoDB"))
            caller.execute(text("INSERT INTO kept VALUES (1)"))
            caller.commit()
        with pytest.raises(pymysql.err.OperationalError), victim.cursor() as cur:
            cur.execute("SELECT 1")
        private_mariadb.restart()
        private_mariadb.kill()
        assert private_mariadb.pid is None
        assert not private_mariadb.accepts()
        engine.dispose()
        private_mariadb.start()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT n FROM kept")).scalars().all() == [1]
    finally:
        victim.close()
        engine.dispose()


# --------------------------------------------------------------------- skip or fail
def test_a_missing_binary_skips_but_fails_under_require_databases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SQLA_QUEUE_REQUIRE_DATABASES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="sqlaq-no-such-server is not installed"):
        require_binary("sqlaq-no-such-server", "a hint")
    monkeypatch.setenv("SQLA_QUEUE_REQUIRE_DATABASES", "1")
    with pytest.raises(pytest.fail.Exception, match=r"not installed \(a hint\)"):
        require_binary("sqlaq-no-such-server", "a hint")
