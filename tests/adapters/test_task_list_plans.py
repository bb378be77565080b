"""The dashboard's task list and worker list (``adapter.inspection``'s
``task_page`` and ``lease_holders``) read the queue table through an index
beside 200,000 finished attempts, whatever the statistics and whether the
statement is prepared: every state, with and without a process, a cursor
and an id range, as tests/adapters/test_plans.py checks the worker's
statements (its helpers: auto_explain on PostgreSQL, EXPLAIN of each
captured statement on MariaDB and SQLite)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from sqla_queue.adapters import adapter_of
from sqla_queue.adapters.inspection import TASK_STATES
from sqla_queue.config.settings import normalize_url
from tests.adapters.test_plans import (
    Seen,
    _finished_rows,
    _mysql_full_scans,
    _pg_full_scans,
    _sqlite_full_scans,
    captured,
    explained_postgres,
)
from tests.conftest import server_url
from tests.support.app import build

FINISHED = 200_000


def list_everything(engine: Engine, table: Any, *, passes: int = 2) -> int:
    """Every list the API can ask for, ``passes`` times (on PostgreSQL a
    prepared statement's second run is the cached plan's; MariaDB and
    SQLite plan each run afresh: one is enough); how many statements ran."""
    adapter = adapter_of(engine.dialect, table, task_locks=False)
    inspection = adapter.inspection
    asked = 0
    with engine.connect() as conn:
        newest = conn.execute(text(f"SELECT max(id) FROM {table.name}")).scalar_one()
        for _ in range(passes):
            for state in (None, *TASK_STATES):
                for query in (
                    {},
                    {"process": "faturar"},
                    {"before": newest - 5, "external_key": "k"},
                    {"min_id": 3, "max_id": newest // 2},
                ):
                    page = inspection.task_page(conn, limit=50, state=state, **query)
                    assert len(page.rows) <= 50
                    asked += 1
            inspection.lease_holders(conn)
    return asked


def _queue(engine: Engine, table: str) -> None:
    """A backlog of each open status, oldest ids first, before the history."""
    with engine.begin() as conn:
        for status, attempt in (("pendente", 1), ("agendada", 1), ("pendente", 2)):
            conn.execute(
                text(
                    f"INSERT INTO {table} (processo, status, tentativa) "
                    "VALUES ('faturar', :status, :attempt)"
                ),
                [{"status": status, "attempt": attempt}] * 20,
            )
        conn.execute(
            text(
                f"UPDATE {table} SET status = 'processando', worker_id = 'w' "
                f"WHERE id IN (SELECT id FROM (SELECT id FROM {table} ORDER BY id LIMIT 5) AS f)"
            )
        )


@pytest.mark.parametrize("analyse", [False, True], ids=["never-analysed", "analysed"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_postgresql_task_lists_read_an_index(mode: str, analyse: bool) -> None:
    url = str(normalize_url(server_url("postgresql")).render_as_string(hide_password=False))
    app = build(f"fila_{uuid.uuid4().hex[:10]}")
    table = app.Task.__tablename__
    seen = Seen(table)
    with explained_postgres(url, mode, seen) as engine:
        app.Base.metadata.create_all(engine)
        try:
            _queue(engine, table)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        f"INSERT INTO {table} (processo, status, mensagem) "
                        "SELECT 'velho', 'sucesso', 'ok' FROM generate_series(1, :n)"
                    ),
                    {"n": FINISHED},
                )
            if analyse:
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(text(f"ANALYZE {table}"))
            seen.plans.clear()
            asked = list_everything(engine, app.Task.__table__)
        finally:
            app.Base.metadata.drop_all(engine)
    ours = [plan for query, plan in seen.plans if table in query]
    assert len(ours) >= asked, "auto_explain reported too few plans: is it loaded?"
    running = [plan for query, plan in seen.plans if "'processando' AND" in query]
    assert running and all(f"ix_{table}_processando" in plan for plan in running)
    ready = [plan for query, plan in seen.plans if "status = 'pendente' AND" in query]
    assert ready and all(f"ix_{table}_pendente" in plan for plan in ready)
    assert _pg_full_scans(seen) == []


@pytest.mark.parametrize("kind", ["mysql", "sqlite"])
def test_mariadb_and_sqlite_task_lists_read_an_index(kind: str, tmp_path: Path) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'queue.db'}"
    else:
        url = str(normalize_url(server_url("mysql")).render_as_string(hide_password=False))
    app = build(f"fila_{uuid.uuid4().hex[:10]}")
    seen = Seen(app.Task.__tablename__)
    explain = _sqlite_full_scans if kind == "sqlite" else _mysql_full_scans
    with captured(url, seen, explain) as engine:
        app.Base.metadata.create_all(engine)
        try:
            plain = create_engine(url)
            try:
                _queue(plain, seen.table)
                _finished_rows(plain, seen.table, FINISHED)
            finally:
                plain.dispose()
            seen.plans.clear()
            asked = list_everything(engine, app.Task.__table__, passes=1)
        finally:
            app.Base.metadata.drop_all(engine)
    assert seen.explained >= asked
    assert [f"{statement}\n{plan}" for statement, plan in seen.plans] == []
