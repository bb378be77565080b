"""``sqla-queue ddl`` and ``python -m sqla_queue.cli.db_gen``.

The printed SQL is run as is by the databases' own command-line clients
(``psql -f``, ``mysql <``, ``sqlite3``), in databases of its own, and the
schema it makes is compared with the one ``create_all()`` makes from the
same mixins in another database: one source of truth.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, inspect, text
from sqlalchemy.engine import make_url

from sqla_queue import DuplicateTaskError
from sqla_queue.alembic.ddl import queue_tables
from sqla_queue.config.settings import normalize_url
from sqla_queue.schema.configuration_table import PEQ_SETTINGS
from tests.conftest import run_cli
from tests.support.migration_helpers import private_database, schema_snapshot


def _client(kind: str, url: str, script: Path) -> list[str]:
    """The command that runs ``script`` with the database's own client."""
    parsed = make_url(url)
    if kind == "postgresql":
        plain = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        return ["psql", "-v", "ON_ERROR_STOP=1", "-q", "-f", str(script), plain]
    if kind == "mysql":
        command = [
            "mysql",
            "--protocol=tcp",
            "-h",
            str(parsed.host),
            "-P",
            str(parsed.port or 3306),
        ]
        command += ["-u", str(parsed.username)]
        if parsed.password:
            command.append(f"-p{parsed.password}")
        return command
    return ["sqlite3", "-bail", str(parsed.database)]


@pytest.mark.parametrize(
    ("kind", "dialect"),
    [
        ("sqlite", "sqlite"),
        ("postgresql", "postgresql"),
        ("mysql", "mysql"),
        ("mysql", "mariadb"),  # the MariaDB server under its own name
    ],
)
def test_ddl_runs_with_the_database_client_and_matches_create_all(
    kind: str, dialect: str, tmp_path: Path
) -> None:
    with (
        private_database(kind, tmp_path) as url,
        private_database(kind, tmp_path) as reference_url,
    ):
        schema = {"postgresql": "public", "sqlite": "main"}.get(kind) or make_url(url).database
        assert schema is not None
        args = ("ddl", schema, "fila_ddl", "--dialect", dialect, "--subscribers", "--config-table")
        script = tmp_path / "queue.sql"
        script.write_text(run_cli(*args).stdout)
        with script.open() as stdin:
            proc = subprocess.run(
                _client(kind, url, script),
                stdin=stdin,
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""

        reference = create_engine(normalize_url(reference_url))
        tables = queue_tables(None, "fila_ddl", subscribers=True, config_table=True)
        tables[0].metadata.create_all(reference)
        reference.dispose()
        assert schema_snapshot(url) == schema_snapshot(reference_url)
        engine = create_engine(normalize_url(url))
        with engine.connect() as conn:
            count = conn.execute(text("SELECT count(*) FROM queue_configuration")).scalar_one()
            assert count == len(PEQ_SETTINGS)
            if kind == "postgresql":
                (trigger,) = conn.execute(
                    text(
                        "SELECT tgname FROM pg_trigger "
                        "WHERE tgrelid = 'fila_ddl'::regclass AND NOT tgisinternal"
                    )
                ).scalars()
                assert trigger == "fila_ddl_sqlaq_notify"
        engine.dispose()


def test_db_gen_prints_the_queue_and_subscriber_tables_for_postgresql() -> None:
    alias = run_cli("ddl", "public", "fila", "--subscribers").stdout
    proc = subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli.db_gen", "public", "fila"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == alias
    assert "CREATE TABLE public.fila_subscriber (" in alias
    assert 'CREATE TRIGGER "fila_sqlaq_notify" AFTER INSERT ON "public"."fila"' in alias


def test_singlestore_ddl_has_no_postgresql_parts() -> None:
    """Compiled with the SingleStore dialect only: no server runs here."""
    out = run_cli("ddl", "app", "fila", "--dialect", "singlestore").stdout
    # a rowstore table sharded on its primary key (docs/singlestore.md)
    assert "CREATE ROWSTORE TABLE app.fila (" in out
    assert "SHARD KEY (id)" in out
    assert "AUTO_INCREMENT" in out
    assert "TRIGGER" not in out and "WHERE" not in out and "brin" not in out


def test_ddl_output_is_the_same_every_run() -> None:
    first = run_cli("ddl", "public", "fila").stdout
    assert run_cli("ddl", "public", "fila").stdout == first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("public", "bad-name"), "invalid queue name 'bad-name'"),
        (("1abc", "fila"), "invalid schema name '1abc'"),
        (("public", "fila; drop table x"), "invalid queue name 'fila; drop table x'"),
        (
            ("public", "f" * 60, "--subscribers"),
            f"invalid subscriber table name '{'f' * 60}_subscriber': longer than 63 characters",
        ),
        (
            ("public", "fila", "--dialect", "sqlite"),
            "invalid schema name 'public' for SQLite: a SQLite database has one schema, main",
        ),
    ],
    ids=["queue", "schema", "injection", "subscriber-length", "sqlite-schema"],
)
def test_a_bad_name_is_one_line(args: tuple[str, ...], message: str) -> None:
    proc = run_cli("ddl", *args, check=False)
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"Error: {message}")


# ------------------------------------------------- unique tasks' live-key index
@pytest.mark.parametrize(
    ("kind", "dialect"),
    [("sqlite", "sqlite"), ("postgresql", "postgresql"), ("mysql", "mariadb")],
)
def test_ddl_unique_process_makes_the_live_key_index_create_all_makes(
    kind: str, dialect: str, tmp_path: Path
) -> None:
    with (
        private_database(kind, tmp_path) as url,
        private_database(kind, tmp_path) as reference_url,
    ):
        schema = {"postgresql": "public", "sqlite": "main"}.get(kind) or make_url(url).database
        assert schema is not None
        args = ("ddl", schema, "fila_du", "--dialect", dialect)
        args += ("--unique-process", "pular", "--unique-process", "it's")
        script = tmp_path / "queue.sql"
        script.write_text(run_cli(*args).stdout)
        with script.open() as stdin:
            proc = subprocess.run(
                _client(kind, url, script), stdin=stdin, capture_output=True, text=True, timeout=60
            )
        assert proc.returncode == 0, proc.stderr
        reference = create_engine(normalize_url(reference_url))
        tables = queue_tables(None, "fila_du", unique_processes=("pular", "it's"))
        tables[0].metadata.create_all(reference)
        reference.dispose()
        assert schema_snapshot(url) == schema_snapshot(reference_url)
        engine = create_engine(normalize_url(url))
        try:
            names = {ix["name"] for ix in inspect(engine).get_indexes("fila_du")}
            assert "ix_fila_du_unica" in names
            row = {"processo": "it's", "chave_externa": "k", "status": "pendente"}
            with engine.begin() as conn:
                conn.execute(insert(tables[0]), row)
            with engine.connect() as conn:
                conn.begin()
                with pytest.raises(DuplicateTaskError):
                    conn.execute(insert(tables[0]), row)
                conn.rollback()
        finally:
            engine.dispose()


def test_live_key_statements_per_dialect() -> None:
    """The text of the live-key index on each dialect, SingleStore's
    included (compiled only: no SingleStore server here)."""
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    from sqla_queue.adapters.unique import live_key_drop_statements
    from sqla_queue.adapters.unique import live_key_statements as statements

    def live_key_statements(table: Any, processes: list[str], dialect: Any) -> list[str]:
        return [
            str(s.compile(dialect=dialect)).strip() for s in statements(table, processes, dialect)
        ]

    table = queue_tables(None, "fila")[0]
    pg, pg_tenant = live_key_statements(table, ["b", "a"], postgresql.dialect())
    assert pg.startswith(
        "CREATE UNIQUE INDEX ix_fila_unica ON fila (processo, chave_externa) WHERE "
    )
    assert pg.endswith("AND tenant IS NULL")
    assert pg_tenant.startswith(
        "CREATE UNIQUE INDEX ix_fila_tenant_unica ON fila (processo, chave_externa, tenant) WHERE "
    )
    assert pg_tenant.endswith("AND tenant IS NOT NULL")
    for statement in (pg, pg_tenant):
        assert "processo IN ('a', 'b')" in statement
        assert "status IN ('agendada', 'pendente', 'processando')" in statement
        assert "dead = false" in statement and "subscriber_id IS NULL" in statement
    lite, _ = live_key_statements(table, ["a"], sqlite.dialect())
    assert lite.startswith("CREATE UNIQUE INDEX ix_fila_unica ON fila") and "dead = 0" in lite
    [maria] = live_key_statements(table, ["a"], mysql.dialect())
    assert maria.startswith("ALTER TABLE fila ADD COLUMN sqlaq_unique_key CHAR(64)")
    assert "CAST(processo AS BINARY) IN (X'61')" in maria
    assert maria.endswith("STORED, ADD UNIQUE INDEX ix_fila_unica (sqlaq_unique_key)")
    assert live_key_statements(table, [], postgresql.dialect()) == []
    assert live_key_drop_statements(table, mysql.dialect()) == [
        "ALTER TABLE fila DROP INDEX ix_fila_unica, DROP COLUMN sqlaq_unique_key"
    ]
    assert live_key_drop_statements(table, postgresql.dialect()) == [
        "DROP INDEX IF EXISTS ix_fila_unica",
        "DROP INDEX IF EXISTS ix_fila_tenant_unica",
    ]


def test_singlestore_ddl_has_no_live_key_index() -> None:
    """SingleStore's unique keys must contain the shard key (id): the
    live-key index cannot be made there; the key table is (not run: no
    SingleStore server here)."""
    out = run_cli(
        "ddl", "app", "fila", "--dialect", "singlestore", "--unique-process", "pular"
    ).stdout
    assert "CREATE ROWSTORE TABLE app.fila (" in out
    assert "fila_unique" in out
    assert "unica" not in out and "sqlaq_unique_key" not in out
