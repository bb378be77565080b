"""The dashboard's history (``GET /api/history``, the overview's chart)
reads a bounded part of a large queue table, through the primary key:
beside 200,000 attempts that finished days ago, as
tests/adapters/test_task_list_plans.py sets up the task list's check.

``finished_at`` has no index, so what bounds the history is the id range
of each ``InspectionQueries.finished_history`` statement: the status counts
(``status_counts``) keep each range of ``CHUNK_IDS`` ids with its newest
finish, and the history reads only the ranges that may hold a finish in
the window and the newest ones (ops/dashboard/history.py). Checked here:
the ranges read are only the newest, at most two ranges' worth of ids, and
each statement reads its range through the primary key (an ``Index Cond``
on ``id`` on PostgreSQL, prepared, generic and custom plans, analysed or
not; a ``range`` on ``PRIMARY`` on MariaDB; a ``SEARCH ... USING INTEGER
PRIMARY KEY`` on SQLite), whatever window is asked, on the first call of a
process and on the next."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, insert, text

from sqla_queue.adapters.inspection import InspectionQueries
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import normalize_url
from sqla_queue.ops import status_counts
from sqla_queue.ops.dashboard.history import WINDOWS, finished_history
from tests.adapters.test_plans import Seen, captured, explained_postgres
from tests.adapters.test_task_list_plans import FINISHED, _queue
from tests.conftest import server_url
from tests.support.app import build

#: the attempts that finished in the last hour, at the newest ids
RECENT = 20
#: what marks the history's statement among those run on the table
HISTORY = "AS bucket"


def _old_and_recent(engine: Engine, table: Any) -> None:
    """FINISHED attempts that finished three days ago, then RECENT that
    finished ten minutes ago (half of them failed)."""
    long_ago = utcnow() - dt.timedelta(days=3)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"INSERT INTO {table.name} (processo, status, mensagem, finished_at) "
                    "SELECT 'velho', 'sucesso', 'ok', :at FROM generate_series(1, :n)"
                ),
                {"at": long_ago, "n": FINISHED},
            )
    else:
        rows = [
            {"processo": "velho", "status": "sucesso", "mensagem": "ok", "finished_at": long_ago}
        ] * 5000
        with engine.begin() as conn:
            for _ in range(FINISHED // len(rows)):
                conn.execute(insert(table), rows)
    recently = utcnow() - dt.timedelta(minutes=10)
    with engine.begin() as conn:
        conn.execute(
            insert(table),
            [
                {
                    "processo": "faturar",
                    "status": "sucesso" if n % 2 else "falha",
                    "mensagem": "boom",
                    "finished_at": recently,
                }
                for n in range(RECENT)
            ],
        )


def read_history(
    engine: Engine, table: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[int, int]], int]:
    """The history of every window, twice (a process's first call, with no
    kept counts, and the next); the id ranges its statements read, and
    the newest id. Checks what it counted."""
    ranges: list[tuple[int, int]] = []
    real = InspectionQueries.finished_history

    def spied(self: InspectionQueries, conn: Any, **asked: Any) -> list[Any]:
        ranges.append((asked["low"], asked["high"]))
        return real(self, conn, **asked)

    monkeypatch.setattr(InspectionQueries, "finished_history", spied)
    status_counts.forget_all()
    try:
        for _ in range(2):
            for window in WINDOWS:
                found = finished_history(engine, table, window=window).buckets
                assert sum(b.succeeded + b.failed for b in found) == RECENT
                assert {b.process for b in found} == {"faturar"}
    finally:
        status_counts.forget_all()
    with engine.connect() as conn:
        newest = conn.execute(text(f"SELECT max(id) FROM {table.name}")).scalar_one()
    return ranges, int(newest)


def assert_bounded(ranges: list[tuple[int, int]], newest: int) -> None:
    """Only the newest ranges were read: the old ones (every finish there
    three days old) were skipped."""
    chunk = status_counts.CHUNK_IDS
    assert newest > 3 * chunk  # more ranges than the two newest
    assert len(ranges) == 2 * len(WINDOWS)  # one statement a call
    assert set(ranges) == {((newest // chunk - 1) * chunk, newest)}
    assert all(high - low < 2 * chunk for low, high in ranges)


@pytest.mark.parametrize("analyse", [False, True], ids=["never-analysed", "analysed"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_postgresql_history_reads_a_bounded_range_of_the_primary_key(
    mode: str, analyse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(normalize_url(server_url("postgresql")).render_as_string(hide_password=False))
    app = build(f"fila_{uuid.uuid4().hex[:10]}")
    table = app.Task.__table__
    seen = Seen(table.name)
    with explained_postgres(url, mode, seen) as engine:
        app.Base.metadata.create_all(engine)
        try:
            _queue(engine, table.name)
            _old_and_recent(engine, table)
            if analyse:
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(text(f"ANALYZE {table.name}"))
            seen.plans.clear()
            ranges, newest = read_history(engine, table, monkeypatch)
        finally:
            app.Base.metadata.drop_all(engine)
    assert_bounded(ranges, newest)
    plans = [plan for query, plan in seen.plans if HISTORY in query and table.name in query]
    assert len(plans) >= len(ranges), "auto_explain reported too few plans: is it loaded?"
    for plan in plans:
        assert not re.search(rf"Seq Scan on {table.name}\b", plan), plan
        assert re.search(rf"(Index Scan using|Bitmap Index Scan on) {table.name}_pkey\b", plan)
        assert re.search(r"Index Cond: \(\(id >= .+\) AND \(id <= .+\)\)", plan), plan


def _mysql_plan(cursor: Any, statement: str, parameters: Any, table: str) -> list[str]:
    """The history statement's EXPLAIN rows of ``table``, each as its dict."""
    if HISTORY not in statement:
        return []
    cursor.execute(f"EXPLAIN {statement}", parameters)
    names = [column[0] for column in cursor.description]
    plans = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return [str(plan) for plan in plans if plan["table"] == table]


def _sqlite_plan(cursor: Any, statement: str, parameters: Any, table: str) -> list[str]:
    """The history statement's query plan, its steps on one line each."""
    if HISTORY not in statement:
        return []
    cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
    return ["\n".join(row[3] for row in cursor.fetchall())]


@pytest.mark.parametrize("kind", ["mysql", "sqlite"])
def test_mariadb_and_sqlite_history_reads_a_bounded_range_of_the_primary_key(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'queue.db'}"
    else:
        url = str(normalize_url(server_url("mysql")).render_as_string(hide_password=False))
    app = build(f"fila_{uuid.uuid4().hex[:10]}")
    table = app.Task.__table__
    seen = Seen(table.name)
    explain = _sqlite_plan if kind == "sqlite" else _mysql_plan
    with captured(url, seen, explain) as engine:
        app.Base.metadata.create_all(engine)
        try:
            plain = create_engine(url)
            try:
                _queue(plain, table.name)
                _old_and_recent(plain, table)
            finally:
                plain.dispose()
            seen.plans.clear()
            ranges, newest = read_history(engine, table, monkeypatch)
        finally:
            app.Base.metadata.drop_all(engine)
    assert_bounded(ranges, newest)
    plans = [plan for _, plan in seen.plans]
    assert len(plans) >= len(ranges)
    for plan in plans:
        if kind == "sqlite":
            assert not re.search(rf"^SCAN {table.name}\b", plan, re.M), plan
            search = rf"^SEARCH {table.name} USING INTEGER PRIMARY KEY \(rowid>\? AND rowid<\?\)"
            assert re.search(search, plan, re.M), plan
        else:
            assert "'type': 'range'" in plan and "'key': 'PRIMARY'" in plan, plan
