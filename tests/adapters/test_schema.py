"""The schema ``metadata.create_all()`` builds from ``QueueMixin``.

The seed's column names on every dialect, the claim indexes (partial on
PostgreSQL and SQLite), the PostgreSQL NOTIFY trigger, and validation of the
names that end up inside SQL text. NOTIFY delivery is checked with a raw
psycopg connection that LISTENs and waits on ``notifies()`` with a deadline.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    Engine,
    create_engine,
    create_mock_engine,
    event,
    inspect,
    make_url,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Session
from sqlalchemy.schema import CreateTable
from sqlalchemy_singlestoredb import dialect as SingleStoreDialect

from sqla_queue import ConfigurationError, InvalidIdentifierError, QueueClient, QueueMixin
from tests.conftest import SEED_COLUMNS, TABLE_COLUMNS, created_engine, server_url
from tests.support.app import App

# nsj-reference.md §1, as PostgreSQL reports the reference DDL
REFERENCE_PG_TYPES = {
    "id": ("bigint", None),
    "id_inicial": ("bigint", None),
    "data_hora_inicial": ("timestamp with time zone", None),
    "data_hora": ("timestamp with time zone", None),
    "origem": ("character varying", 150),
    "destino": ("character varying", 150),
    "processo": ("character varying", 250),
    "chave_externa": ("character varying", 100),
    "proxima_tentativa": ("timestamp with time zone", None),
    "tentativa": ("integer", None),
    "status": ("character varying", 100),
    "reenfileirado": ("boolean", None),
    "estouro_tentativas": ("boolean", None),
    "mensagem": ("character varying", 500),
    "id_anterior": ("bigint", None),
    "data_hora_anterior": ("timestamp with time zone", None),
    "status_anterior": ("character varying", 100),
    "mensagem_anterior": ("character varying", 500),
    "payload": ("text", None),
    "tenant": ("bigint", None),
    "grupo_empresarial": ("character varying", 40),
    "payload_hash": ("bytea", None),
    "pub_sub": ("boolean", None),
    "publication_id": ("bigint", None),
    "subscriber_id": ("character varying", 100),
    "dead": ("boolean", None),
    "live_id": ("bigint", None),
    "prioridade": ("integer", None),
}
NOT_NULL = {"id", "pub_sub", "dead"}
BAD_NAMES = ["fila; drop table x", "1abc", "a" * 70, "bad-name", "fila x", 'fila"x', "ação"]

postgresql_only = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
mysql_only = pytest.mark.parametrize("db_url", ["mysql"], indirect=True)


def _model(table: str, **attributes: Any) -> type[Any]:
    """A queue model on a fresh declarative Base."""

    class Base(DeclarativeBase):
        pass

    return type("Task", (QueueMixin, Base), {"__tablename__": table, **attributes})


@pytest.fixture
def listener() -> Iterator[psycopg.Connection[Any]]:
    """A raw psycopg connection in autocommit, ready to LISTEN."""
    url = make_url(server_url("postgresql")).set(drivername="postgresql")
    conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def _notifications(conn: psycopg.Connection[Any], count: int) -> list[tuple[str, str]]:
    """The next ``count`` notifications, waiting at most 10 s for them."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=10, stop_after=count)]


# --------------------------------------------------------------- columns
def test_create_all_creates_the_seed_columns_then_the_lease_columns(
    engine: Engine, table_name: str
) -> None:
    columns = inspect(engine).get_columns(table_name)
    assert [c["name"] for c in columns] == TABLE_COLUMNS


def test_only_id_pub_sub_and_dead_are_not_null(engine: Engine, table_name: str) -> None:
    not_null = {c["name"] for c in inspect(engine).get_columns(table_name) if not c["nullable"]}
    assert not_null == NOT_NULL


@postgresql_only
def test_postgresql_column_types_match_the_reference_ddl(engine: Engine, table_name: str) -> None:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT column_name, data_type, character_maximum_length "
                "FROM information_schema.columns WHERE table_name = :t"
            ),
            {"t": table_name},
        ).all()
    assert {name: (kind, length) for name, kind, length in rows} == {
        **REFERENCE_PG_TYPES,
        "worker_id": ("character varying", 100),
        "lease_expires_at": ("timestamp with time zone", None),
        "started_at": ("timestamp with time zone", None),
        "finished_at": ("timestamp with time zone", None),
        "error_traceback": ("text", None),
        "trace_context": ("text", None),
    }


@mysql_only
def test_mysql_column_types(engine: Engine, table_name: str) -> None:
    with engine.connect() as conn:
        types = dict(
            conn.execute(
                text(
                    "SELECT column_name, column_type FROM information_schema.columns "
                    "WHERE table_schema = DATABASE() AND table_name = :t"
                ),
                {"t": table_name},
            ).all()
        )
    assert {
        name: types[name]
        for name in (
            "data_hora",
            "data_hora_inicial",
            "payload",
            "payload_hash",
            "prioridade",
            "status",
            "mensagem",
            "pub_sub",
        )
    } == {
        "data_hora": "datetime(6)",
        "data_hora_inicial": "datetime(6)",
        "payload": "longtext",
        "payload_hash": "varbinary(64)",
        "prioridade": "int(11)",
        "status": "varchar(100)",
        "mensagem": "varchar(500)",
        "pub_sub": "tinyint(1)",
    }
    assert types["id"].startswith("bigint")


# --------------------------------------------------------------- indexes
def test_claim_indexes_exist(engine: Engine, table_name: str) -> None:
    names = {index["name"] for index in inspect(engine).get_indexes(table_name)}
    common = {
        f"ix_{table_name}_equivalente",
        f"ix_{table_name}_data_hora",
        f"ix_{table_name}_inicial",
        f"ix_{table_name}_live",
    }
    if engine.dialect.name in ("postgresql", "sqlite"):
        expected = common | {
            f"ix_{table_name}_{s}"
            for s in (
                "pendente",
                "agendada",
                "processando",
                "pendente_processo",
                "pendente_assinante",
            )
        }
        if engine.dialect.name == "postgresql":  # a publication's copies
            expected.add(f"ix_{table_name}_publicacao")
    else:
        expected = common | {
            f"ix_{table_name}_status_prioridade",
            f"ix_{table_name}_status_data_hora",
            f"ix_{table_name}_status_processo",
            f"ix_{table_name}_status_assinante",
        }
    assert names == expected


@postgresql_only
def test_postgresql_partial_indexes(engine: Engine, table_name: str) -> None:
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = :t"),
                {"t": table_name},
            ).all()
        )
    for status in ("pendente", "agendada", "processando"):
        assert rows[f"ix_{table_name}_{status}"].endswith(
            f"WHERE ((status)::text = '{status}'::text)"
        )
    assert "(prioridade DESC, data_hora, id)" in rows[f"ix_{table_name}_pendente"]
    assert rows[f"ix_{table_name}_equivalente"].endswith(
        "USING hash (payload_hash) "
        "WHERE ((payload_hash IS NOT NULL) AND ((status)::text <> 'processando'::text))"
    )
    assert "USING brin (data_hora)" in rows[f"ix_{table_name}_data_hora"]
    assert rows[f"ix_{table_name}_inicial"].endswith("(id_inicial) WHERE (id_inicial IS NOT NULL)")
    assert rows[f"ix_{table_name}_live"].endswith("(live_id) WHERE (live_id IS NOT NULL)")


@postgresql_only
@pytest.mark.parametrize(
    ("statuses", "indexes"),
    [
        (None, ["equivalente"]),
        (["processando"], ["processando"]),
        (["sucesso", "processando", "falha"], ["equivalente", "processando"]),
    ],
    ids=["default", "running", "mixed"],
)
def test_equivalence_lookup_can_use_its_partial_index(
    engine: Engine, app: App, statuses: list[str] | None, indexes: list[str]
) -> None:
    # the lookup's "payload_hash = :h" implies the partial index's "IS NOT
    # NULL", its literal "status <> 'processando'" the rest of the predicate,
    # whatever the bound statuses; running tasks come through ix_processando
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        seen.append((statement, params))

    kwargs = {} if statuses is None else {"status": statuses}
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        client.insert_task("o", "d", "p", "k", {"a": 1})
        event.listen(conn, "before_cursor_execute", capture)
        client.list_equivalent_task("o", "d", "p", "k", {"a": 1}, **kwargs)
        event.remove(conn, "before_cursor_execute", capture)
        statement, params = seen[-1]
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params))
        conn.rollback()
    assert "Seq Scan" not in plan, plan
    for name in indexes:
        assert f"ix_{app.Task.__tablename__}_{name}" in plan, plan


def test_sqlite_partial_indexes(tmp_path: Any, app: App, table_name: str) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'schema.db'}")
    app.Base.metadata.create_all(engine)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"),
                {"t": table_name},
            ).all()
        )
    engine.dispose()
    for status in ("pendente", "agendada", "processando"):
        assert rows[f"ix_{table_name}_{status}"].endswith(f"WHERE status = '{status}'")
    assert rows[f"ix_{table_name}_equivalente"].endswith(
        "WHERE payload_hash IS NOT NULL AND status != 'processando'"
    )


# --------------------------------------------------------- NOTIFY trigger
@postgresql_only
def test_postgresql_notify_trigger_exists(engine: Engine, table_name: str) -> None:
    with engine.connect() as conn:
        triggers = (
            conn.execute(
                text(
                    "SELECT tgname FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass) "
                    "AND NOT tgisinternal"
                ),
                {"t": table_name},
            )
            .scalars()
            .all()
        )
    assert triggers == [f"{table_name}_sqlaq_notify"]


@postgresql_only
def test_plain_sql_insert_notifies_the_table_channel(
    engine: Engine, table_name: str, listener: psycopg.Connection[Any]
) -> None:
    listener.execute(f'LISTEN "{table_name}"')
    with engine.begin() as conn:
        conn.execute(
            text(f'INSERT INTO "{table_name}" (processo, payload) VALUES (:p, :x)'),
            {"p": "legado", "x": "{}"},
        )
    assert _notifications(listener, 1) == [(table_name, "")]


@postgresql_only
def test_orm_enqueue_notifies_after_commit(
    engine: Engine, app: App, table_name: str, installed: None, listener: psycopg.Connection[Any]
) -> None:
    listener.execute(f'LISTEN "{table_name}"')
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="faturar", payload={"invoice": 1}))
    assert _notifications(listener, 1) == [(table_name, "")]


@postgresql_only
def test_rolled_back_insert_sends_no_notification(
    engine: Engine, table_name: str, listener: psycopg.Connection[Any]
) -> None:
    listener.execute(f'LISTEN "{table_name}"')
    with engine.connect() as conn:
        conn.execute(text(f'INSERT INTO "{table_name}" (processo) VALUES (:p)'), {"p": "x"})
        conn.rollback()
        # notifications arrive in commit order: a marker sent afterwards comes
        # first only if the rolled-back insert sent nothing
        conn.execute(text("SELECT pg_notify(:c, 'marker')"), {"c": table_name})
        conn.commit()
    assert _notifications(listener, 1) == [(table_name, "marker")]


@pytest.mark.postgresql
def test_queue_channel_overrides_the_channel(
    table_name: str, listener: psycopg.Connection[Any]
) -> None:
    channel = f"canal_{uuid.uuid4().hex[:8]}"
    model = _model(table_name, __queue_channel__=channel)
    assert model.__table__.info["sqla_queue"] == {"channel": channel}
    engine = create_engine(server_url("postgresql"))
    model.metadata.create_all(engine)
    try:
        listener.execute(f'LISTEN "{channel}"')
        listener.execute(f'LISTEN "{table_name}"')
        with engine.begin() as conn:
            conn.execute(text(f'INSERT INTO "{table_name}" (processo) VALUES (:p)'), {"p": "x"})
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_notify(:c, 'marker')"), {"c": table_name})
        # the insert woke the custom channel only, before the marker
        assert _notifications(listener, 2) == [(channel, ""), (table_name, "marker")]
    finally:
        model.metadata.drop_all(engine)
        engine.dispose()


@pytest.mark.postgresql
def test_drop_all_removes_the_notify_function(table_name: str) -> None:
    model = _model(table_name)
    engine = create_engine(server_url("postgresql"))
    count = text("SELECT count(*) FROM pg_proc WHERE proname = :f")
    try:
        model.metadata.create_all(engine)
        with engine.connect() as conn:
            assert conn.execute(count, {"f": f"{table_name}_sqlaq_notify"}).scalar_one() == 1
        model.metadata.drop_all(engine)
        with engine.connect() as conn:
            assert conn.execute(count, {"f": f"{table_name}_sqlaq_notify"}).scalar_one() == 0
    finally:
        model.metadata.drop_all(engine)
        engine.dispose()


# ----------------------------------------------------------- SingleStore
def test_singlestore_ddl_compiles(app: App, table_name: str) -> None:
    """The DDL compiles with the SingleStore dialect (sqlalchemy_singlestoredb).

    Compiled only: no SingleStore server is available here, so this DDL has
    not been run against one."""
    ddl = str(CreateTable(app.Task.__table__).compile(dialect=SingleStoreDialect()))
    lines = {line.strip().rstrip(",") for line in ddl.splitlines()}
    assert {
        f"CREATE ROWSTORE TABLE {table_name} (",
        "id BIGINT NOT NULL AUTO_INCREMENT",
        "data_hora_inicial DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6)",
        "data_hora DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6)",
        "tentativa INTEGER DEFAULT 1",
        "status VARCHAR(100) DEFAULT 'pendente'",
        "payload LONGTEXT",
        "payload_hash VARBINARY(64)",
        "pub_sub BOOL NOT NULL DEFAULT false",
        "dead BOOL NOT NULL DEFAULT false",
        "prioridade INTEGER DEFAULT 50",
        "PRIMARY KEY (id)",
        "SHARD KEY (id)",
    } <= lines
    for column in SEED_COLUMNS:
        assert any(line.startswith(f"{column} ") for line in lines), column


def test_singlestore_create_all_emits_no_postgresql_ddl(app: App, table_name: str) -> None:
    """What ``create_all`` would send to SingleStore, collected by a mock engine.

    Compiled only: no SingleStore server ran."""
    statements: list[str] = []

    def collect(sql: Any, *args: Any, **kwargs: Any) -> None:
        statements.append(" ".join(str(sql.compile(dialect=mock.dialect)).split()))

    mock = create_mock_engine("singlestoredb://", collect)
    app.Task.__table__.create(mock, checkfirst=False)
    assert statements[0].startswith(f"CREATE ROWSTORE TABLE {table_name} (")
    assert sorted(statements[1:]) == sorted(
        [
            f"CREATE INDEX ix_{table_name}_status_prioridade ON {table_name} "
            "(status, prioridade DESC, data_hora)",
            f"CREATE INDEX ix_{table_name}_status_data_hora ON {table_name} (status, data_hora)",
            f"CREATE INDEX ix_{table_name}_status_processo ON {table_name} "
            "(status, processo, prioridade DESC, data_hora)",
            f"CREATE INDEX ix_{table_name}_status_assinante ON {table_name} "
            "(status, subscriber_id)",
            f"CREATE INDEX ix_{table_name}_equivalente ON {table_name} "
            "(chave_externa, payload_hash, status)",
            f"CREATE INDEX ix_{table_name}_data_hora ON {table_name} (data_hora)",
            f"CREATE INDEX ix_{table_name}_inicial ON {table_name} (id_inicial)",
            f"CREATE INDEX ix_{table_name}_live ON {table_name} (live_id)",
        ]
    )
    assert not any("TRIGGER" in s or "FUNCTION" in s or "WHERE" in s for s in statements)


# ------------------------------------------------------- name validation
@pytest.mark.parametrize("bad", BAD_NAMES, ids=lambda n: repr(n)[:20])
def test_invalid_table_name_is_refused(bad: str) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        _model(bad)
    assert repr(bad) in str(info.value)
    assert isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize("bad", BAD_NAMES, ids=lambda n: repr(n)[:20])
def test_invalid_channel_name_is_refused(bad: str, table_name: str) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        _model(table_name, __queue_channel__=bad)
    assert str(info.value).startswith(f"invalid channel name {bad!r}")


@pytest.mark.parametrize("bad", ["bad-name", "1abc", "x; drop schema public"])
def test_invalid_schema_name_is_refused(bad: str, table_name: str) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        _model(table_name, __table_args__={"schema": bad})
    assert str(info.value).startswith(f"invalid schema name {bad!r}")


def test_seventy_character_name_error_gives_the_limit() -> None:
    with pytest.raises(InvalidIdentifierError, match="longer than 63 characters"):
        _model("a" * 70)


def test_invalid_table_name_is_reported_as_a_table_name() -> None:
    with pytest.raises(InvalidIdentifierError, match=r"^invalid table name 'bad-name'"):
        _model("bad-name")


@pytest.mark.parametrize("where", ["table", "channel", "client"])
def test_name_with_a_trailing_newline_is_refused(where: str, table_name: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        if where == "table":
            _model("fila\n")
        elif where == "channel":
            _model(table_name, __queue_channel__="canal\n")
        else:
            with Session(create_engine("sqlite://")) as s:
                QueueClient(s, "fila\n")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("bad name", "invalid table name 'bad name'"),
        ("fila; drop table x", "invalid table name 'fila; drop table x'"),
        ("1abc", "invalid table name '1abc'"),
        ("a" * 70, f"invalid table name '{'a' * 70}': longer than 63 characters"),
        ("bad-name", "invalid table name 'bad-name'"),
        ("bad-name.fila", "invalid schema name 'bad-name'"),
        ("a.b.fila", "invalid schema name 'a.b'"),
        ("public.", "invalid table name ''"),
    ],
)
def test_queue_client_refuses_an_invalid_table_name(bad: str, message: str) -> None:
    with Session(create_engine("sqlite://")) as s, pytest.raises(InvalidIdentifierError) as info:
        QueueClient(s, bad)
    assert str(info.value).startswith(message)


def test_queue_client_refuses_an_invalid_subscriber_table_name() -> None:
    with (
        Session(create_engine("sqlite://")) as s,
        pytest.raises(InvalidIdentifierError, match="invalid table name 'bad name'"),
    ):
        QueueClient(s, "fila", "bad name")


# ------------------------------------------------- longest accepted name
@pytest.mark.parametrize(
    "db_url",
    [
        "sqlite",
        "postgresql",
        "mysql",
    ],
    indirect=True,
)
def test_longest_accepted_table_name_can_be_created(db_url: str) -> None:
    name = ("fila_" + uuid.uuid4().hex * 2)[:63]
    model = _model(name)
    engine = create_engine(db_url)
    try:
        model.metadata.create_all(engine)
        assert [c["name"] for c in inspect(engine).get_columns(name)] == TABLE_COLUMNS
    finally:
        model.metadata.drop_all(engine)
        with engine.begin() as conn:  # MySQL keeps a table whose index failed
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
        engine.dispose()


def test_a_queue_without_the_equivalence_index_still_finds_equivalent_tasks(
    db_url: str, table_name: str
) -> None:
    class Base(DeclarativeBase):
        pass

    class Lean(QueueMixin, Base):
        __tablename__ = table_name
        __queue_equivalence_index__ = False

    assert f"ix_{table_name}_equivalente" not in {index.name for index in Lean.__table__.indexes}
    with created_engine(db_url, Base.metadata) as engine, engine.begin() as conn:
        names = {index["name"] for index in inspect(conn).get_indexes(table_name)}
        assert f"ix_{table_name}_equivalente" not in names
        client = QueueClient(conn, Lean)
        task_id = client.insert_task("o", "d", "p", "k", {"a": 1})
        client.insert_task("o", "d", "p", "k", {"a": 2})
        found = client.list_equivalent_task("o", "d", "p", "k", {"a": 1})
        assert [task.id for task in found] == [task_id]
