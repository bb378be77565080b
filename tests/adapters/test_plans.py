"""Every statement the worker, the heartbeat, the rescue, the routines, the
client and the monitoring queries run against a queue table reads it through
an index, whatever the statistics and whether the statement is prepared.

PostgreSQL: each statement runs prepared from its first execution
(``prepare_threshold=0``) under ``plan_cache_mode`` forced to the generic
plan, then to custom plans, on a table created empty and never analysed,
and on one holding a million dead tuples (autovacuum is off on these
machines; nothing analyses it). ``auto_explain`` sends each executed plan
back to the client as a NOTICE, so the plans checked are the ones the
statements really ran with. MariaDB and SQLite: the statements are captured
as they run and then explained with the same parameters.

A plan fails when it scans the whole queue table (``Seq Scan`` on
PostgreSQL, ``type: ALL`` on MariaDB, ``SCAN`` without an index on SQLite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, or_, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, control, install, uninstall
from sqla_queue.adapters import ClaimFilter, adapter_for, adapter_of
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings, normalize_url
from sqla_queue.maintenance import ROUTINES, ManualClock, Periodic
from sqla_queue.policies.fairness import FairClaims
from sqla_queue.schema.configuration_table import configuration_table_of
from sqla_queue.worker import Runner
from tests.conftest import server_url
from tests.support.app import App, build

#: of the finished history, this many oldest rows are made old enough to purge
OLD_HISTORY = 5_000
# the monitoring queries of docs/lifecycle.md and docs/columns.md, as a
# user or `status` would run them ({t}: the table)
MONITORING = [
    "SELECT count(*) FROM {t} WHERE status = 'pendente' AND data_hora <= CURRENT_TIMESTAMP",
    "SELECT id, worker_id, lease_expires_at FROM {t} WHERE status = 'processando'",
    "SELECT min(data_hora) FROM {t} WHERE status = 'pendente'",
    "SELECT min(data_hora) FROM {t} WHERE status = 'agendada'",
]


@dataclass
class Seen:
    """The plans (or the statements to explain) of one table."""

    table: str
    plans: list[tuple[str, str]] = field(default_factory=list)  # (statement, plan)
    explained: int = 0


# ------------------------------------------------------------------ workload
def exercise(engine: Engine, app: App, plain: Engine) -> None:
    """What a worker's life runs against the table: enqueue (ORM and the
    client), claims, completions, failures and their retries, a scheduled
    task's promotion, the heartbeat, a hand-back, the rescue, every
    maintenance routine, the equivalence look-up. ``plain``: an engine
    whose statements are not checked, for the test's own set-up."""
    install(Session)
    try:
        with Session(engine) as session, session.begin():
            session.add_all(
                [app.Task(process="faturar", payload={"n": n}) for n in range(6)]
                + [app.Task(process="faturar", payload={"fail": "once"})]
                + [app.Task(process="faturar", payload={"later": 1}, run_at=utcnow())]
            )
        with Session(engine) as session, session.begin():
            client = QueueClient(session, app.Task.__tablename__)
            client.insert_task(processo="faturar", chave_externa="k1", payload={"c": 1})
            client.insert_tasks([{"processo": "faturar", "payload": {"c": n}} for n in range(3)])
            client.list_equivalent_task(processo="faturar", chave_externa="k1", payload={"c": 1})
    finally:
        uninstall(Session)
    env = {"SQLA_QUEUE_ITEM_TTL": "60", "QUEUE_PURGE_MAX_AGE": "0.0001"}
    settings = Settings.from_env(env)

    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

    class Routed(Worker):  # claims through ix_<table>_pendente_processo
        processes = frozenset({"faturar"})

    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task.__tablename__).insert_task(processo="faturar", payload={})
    assert Routed().run(engine=engine, burst=True, settings=settings, batch_size=4) == 0
    worker = Worker()
    assert worker.run(engine=engine, burst=True, settings=settings, batch_size=4) == 0

    class Periodical(app.RecordingWorker):  # type: ignore[name-defined,misc]
        periodic = (Periodic("probe", "@every 1s", process="faturar"),)

    runner = Runner.for_worker(Periodical(), engine=engine, settings=settings)
    adapter, owner = runner.adapter, "probe"
    with plain.begin() as conn:  # a day old: the purge and the TTL have work
        t = app.Task
        first = conn.execute(select(func.min(t.id)).where(t.process == "velho")).scalar()
        # of the history only its oldest OLD_HISTORY rows: the purge deletes
        # a few chunks, each planned beside the rest of the history (all of
        # it old made the purge 4,000 statements, 11 s of EXPLAINs on MariaDB)
        old = t.process != "velho"
        if first is not None:
            old = or_(old, t.id < first + OLD_HISTORY)
        conn.execute(update(t).where(old).values(data_hora=utcnow() - dt.timedelta(days=1)))
    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task.__tablename__).insert_task(processo="faturar", payload={})
    with contextlib.closing(adapter.connect_claim(engine)) as claim:
        for _ in range(2):  # a prepared statement's second run is the cached plan's
            with claim.begin() if not adapter.claim_autocommit else contextlib.nullcontext():
                taken = adapter.task_claim_many(claim, limit=2, owner=owner, lease_seconds=30)
            ids = [task.id for task in taken]
            # each on the connection the worker runs it on: the heartbeat's
            # is a claim connection, the routines' a maintenance one
            with adapter.connect_claim(engine) as conn, conn.begin():
                adapter.task_lease_renew(conn, ids=ids, owner=owner, lease_seconds=30)
            with adapter.connect_maintenance(engine) as conn, conn.begin():
                adapter.task_ready_exists(conn)
                adapter.task_next_due(conn)
                adapter.task_promote_due(conn)
            with engine.begin() as conn:  # a lane's work connection
                adapter.task_hand_back_many(conn, ids=ids, owner=owner)
            adapter.lock_release_many(claim, ids=ids)
            if claim.in_transaction():
                claim.commit()
    for name in ROUTINES:
        routine = runner.maintenance.routine(name)
        clock = routine.clock = ManualClock() if name == "periodic" else routine.clock
        for _ in range(2):
            routine.run_once()
            if isinstance(clock, ManualClock):  # the first starts it, the second enqueues
                clock.advance(1)
    configuration_table_of(app.Task).drop(plain, checkfirst=True)
    with engine.begin() as conn:
        for query in MONITORING:
            conn.execute(text(query.format(t=app.Task.__tablename__)))
    operator(engine, app, adapter)


def operator(engine: Engine, app: App, adapter: Any) -> None:
    """What `sqla-queue status`, its timeline, cancel and retry-now read and
    write (all but a status's first pass over the finished chains, which
    reads them all by design: docs/operations.md; its later calls read
    primary-key ranges)."""
    queries = adapter.inspection
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task.__tablename__)
        ready = client.insert_task(processo="operar", payload={"n": 1})
        later = client.insert_task(
            processo="operar", payload={"n": 2}, data_hora=utcnow() + dt.timedelta(days=1)
        )
    for _ in range(2):
        with engine.begin() as conn:
            queries.open_groups(conn)
            # the finished states of status' repeated calls (status_summary.py)
            queries.open_by_range(conn, 65_536)
            queries.id_bounds(conn)
            queries.closed_range(conn, since=utcnow(), low=ready, high=ready + 65_535, size=65_536)
            queries.running(conn, limit=20)
            # a limited process's running tasks (sqla_queue/policies/limits.py)
            adapter.limits.running(conn, "operar")
            # a unique task's chain (sqla_queue/enqueue/unique.py)
            adapter.unique(adapter.table).newest_attempt(conn, ready)
            queries.newest_failures(conn, limit=10)
            queries.task_row(conn, task_id=ready)
            queries.chain_rows(conn, keys=[ready])
            queries.live_rows(conn, keys=[ready])
            queries.copies(conn, publications=[ready])
            control.cancel_process(conn, adapter, "nenhum", older_than=dt.timedelta(hours=1))
    with engine.begin() as conn:
        control.retry_now(conn, adapter, later)
        control.cancel_task(conn, adapter, ready)
    # a fair claim by tenant (fairness.py): the keys' skip scan, each key's
    # share, the rows without a key, the top-up in plain claim order
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task.__tablename__)
        for tenant in (1, 2, None, 1):
            client.insert_task(processo="justo", payload={"t": tenant}, tenant=tenant)
    keyed = ClaimFilter(fair_column="tenant")
    fair = FairClaims(
        adapter,
        lambda null: adapter_for(
            engine.dialect,
            adapter.table,
            adapter.channel,
            claim_filter=dataclasses.replace(keyed, fair_null=null),
        ),
        adapter.fairness("tenant"),
    )
    taken = claim_twice(engine, adapter, fair.task_claim_many, limit=8, owner="fair")
    assert len(taken) >= 4
    # a claim while a process is paused (pause.py): its NOT IN is a filter
    paused = adapter_for(
        engine.dialect,
        adapter.table,
        adapter.channel,
        claim_filter=ClaimFilter(paused=frozenset({"nenhum"})),
    )
    claim_twice(engine, paused, paused.task_claim_many, limit=1, owner="paused")


def claim_twice(
    engine: Engine, adapter: Any, claim_many: Any, *, limit: int, owner: str
) -> set[int]:
    """Claim with ``claim_many`` twice on a claim connection of ``adapter``'s
    (a prepared statement's second run is the cached plan's), each time
    handing the tasks back; the ids of the last claim."""
    ids: list[int] = []
    with contextlib.closing(adapter.connect_claim(engine)) as claim:
        for _ in range(2):
            with claim.begin() if not adapter.claim_autocommit else contextlib.nullcontext():
                taken = claim_many(claim, limit=limit, owner=owner, lease_seconds=30)
            ids = [task.id for task in taken]
            with engine.begin() as conn:
                adapter.task_hand_back_many(conn, ids=ids, owner=owner)
            adapter.lock_release_many(claim, ids=ids)
            if claim.in_transaction():
                claim.commit()
    return set(ids)


# ------------------------------------------------------------------ PostgreSQL
_PG_OPTIONS = (
    "-c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0"
    " -c auto_explain.log_level=notice -c auto_explain.log_nested_statements=on"
)


@contextlib.contextmanager
def explained_postgres(url: str, mode: str, seen: Seen) -> Iterator[Engine]:
    """An engine whose every connection prepares each statement at once,
    plans it under ``plan_cache_mode = mode`` and reports each plan it
    executes into ``seen``."""
    engine = create_engine(
        url,
        connect_args={
            "prepare_threshold": 0,
            "options": f"{_PG_OPTIONS} -c plan_cache_mode={mode}",
        },
    )

    def on_notice(diagnostic: Any) -> None:
        # "duration: ... plan:", "Query Text: ..." (maybe several lines), the plan
        message = diagnostic.message_primary or ""
        if "Query Text:" in message:
            seen.plans.append((message, message))

    @event.listens_for(engine, "connect")
    def _notices(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.add_notice_handler(on_notice)

    try:
        yield engine
    finally:
        engine.dispose()


def _pg_full_scans(seen: Seen) -> list[str]:
    pattern = re.compile(rf"Seq Scan on {re.escape(seen.table)}\b")
    return [f"{query}\n{plan}" for query, plan in seen.plans if pattern.search(plan)]


def make_dead_tuples(engine: Engine, table: str, count: int) -> None:
    """``count`` dead tuples in ``table`` (rows inserted, then deleted)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{table}" (processo, status, payload) '
                "SELECT 'morto', 'sucesso', NULL FROM generate_series(1, :n)"
            ),
            {"n": count},
        )
        conn.execute(text(f"DELETE FROM \"{table}\" WHERE processo = 'morto'"))


@pytest.fixture
def pg_url() -> str:
    return str(normalize_url(server_url("postgresql")).render_as_string(hide_password=False))


@pytest.mark.parametrize("dead", [0, 1_000_000], ids=["empty-never-analysed", "1M-dead"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_postgresql_plans_read_an_index(pg_url: str, mode: str, dead: int) -> None:
    app = build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tenant",))
    table = app.Task.__tablename__
    seen = Seen(table)
    with explained_postgres(pg_url, mode, seen) as engine:
        app.Base.metadata.create_all(engine)
        try:
            if dead:
                make_dead_tuples(engine, table, dead)
            with engine.connect() as conn:
                analysed = conn.execute(
                    text(
                        "SELECT last_analyze, last_autoanalyze, n_dead_tup "
                        "FROM pg_stat_user_tables WHERE relname = :t"
                    ),
                    {"t": table},
                ).one()
            assert analysed[0] is None and analysed[1] is None
            seen.plans.clear()
            plain = create_engine(pg_url)
            try:
                exercise(engine, app, plain)
            finally:
                plain.dispose()
        finally:
            app.Base.metadata.drop_all(engine)
    ours = [plan for query, plan in seen.plans if table in query]
    assert len(ours) > 40, "auto_explain reported too few plans: is it loaded?"
    claims = [
        plan for query, plan in seen.plans if "SKIP LOCKED" in query and "worker_id=" in query
    ]
    # the claim reads the ready rows in its own order and stops after them
    # (a fair claim's share may read the key's own index; on these small
    # tables the planner also takes ix_pendente with a filter on the key)
    fair = f"ix_{table}_justo_tenant"
    assert claims and all(f"ix_{table}_pendente" in plan or fair in plan for plan in claims)
    assert all("Sort" not in plan for plan in claims)
    assert any(f"ix_{table}_pendente_processo" in plan for plan in claims)
    assert _pg_full_scans(seen) == []


@pytest.mark.parametrize("analyse", [False, True], ids=["vacuumed", "vacuumed-and-analysed"])
def test_postgresql_claim_keeps_its_cached_plan_on_a_measured_table(
    pg_url: str, analyse: bool
) -> None:
    """Once a VACUUM (or ANALYZE) has told the planner how big the table
    is, the claim still runs on the plan PostgreSQL cached for it, not
    planned again at every execution (``plan_cache_mode`` at its default).
    With its LIMIT bound, the generic plan reckoned with a tenth of the
    table, the plan cache took a custom plan every time, and the worker's
    latency grew with the table under the vacuum routine (docs/benchmarks.md)."""
    app = build(f"fila_{uuid.uuid4().hex[:10]}")
    table = app.Task.__tablename__
    engine = create_engine(
        pg_url, connect_args={"prepare_threshold": 0}, pool_size=1, max_overflow=0
    )
    app.Base.metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"INSERT INTO {table} (processo, status) "
                    "SELECT 'velho', 'sucesso' FROM generate_series(1, 50000)"
                )
            )
            QueueClient(conn, app.Task).insert_tasks([{"processo": "faturar"}] * 30)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM {'(ANALYZE) ' if analyse else ''}{table}"))
        adapter = adapter_of(engine.dialect, app.Task.__table__)
        with engine.connect() as conn:  # the pool's one connection: its prepared statements
            for _ in range(20):
                with conn.begin():
                    claimed = adapter.task_claim_many(conn, limit=1, owner="w", lease_seconds=60)
                    assert len(claimed) == 1
            plans = conn.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE 'UPDATE%SKIP LOCKED%'"
                )
            ).all()
    finally:
        app.Base.metadata.drop_all(engine)
        engine.dispose()
    assert plans, "the claim was not prepared"
    assert all(generic >= 10 and custom <= 5 for generic, custom in plans), plans


# ------------------------------------------------------------------ MariaDB, SQLite
Explain = Callable[[Any, str, Any, str], list[str]]


@contextlib.contextmanager
def captured(url: str, seen: Seen, explain: Explain) -> Iterator[Engine]:
    """An engine that explains each statement it runs on the queue table
    just before it runs, in its own transaction (so the plan is the one of
    the table as that statement finds it), and records the full scans."""
    engine = create_engine(url)

    @event.listens_for(engine, "before_cursor_execute")
    def _explain(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        many = args[-1] if args else False
        if seen.table in statement and re.match(r"\s*(SELECT|UPDATE|DELETE)", statement, re.I):
            params = parameters[0] if many else parameters
            own = conn.connection.dbapi_connection.cursor()
            try:
                for found in explain(own, statement, params, seen.table):
                    seen.plans.append((statement, found))
            finally:
                own.close()
            seen.explained += 1

    try:
        yield engine
    finally:
        engine.dispose()


def _finished_rows(engine: Engine, table: str, count: int) -> None:
    """``count`` finished attempts, inserted in chunks: the history a real
    queue keeps (the seed keeps every attempt until the purge)."""
    rows = [{"processo": "velho", "status": "sucesso", "mensagem": "ok"}] * 5000
    statement = text(
        f"INSERT INTO {table} (processo, status, mensagem) VALUES (:processo, :status, :mensagem)"
    )
    with engine.begin() as conn:
        for _ in range(count // len(rows)):
            conn.execute(statement, rows)


def _mysql_full_scans(cursor: Any, statement: str, parameters: Any, table: str) -> list[str]:
    cursor.execute(f"EXPLAIN {statement}", parameters)
    names = [column[0] for column in cursor.description]
    found = []
    for row in cursor.fetchall():
        plan = dict(zip(names, row, strict=True))
        # MariaDB plans each run afresh: a scan of a table it counts as
        # small (a new queue) is its right choice there, not a stale plan
        ours = plan["table"] in (table, "inicial")
        if ours and plan["type"] == "ALL" and int(plan["rows"] or 0) > 1000:
            found.append(str(plan))
    return found


def _sqlite_full_scans(cursor: Any, statement: str, parameters: Any, table: str) -> list[str]:
    cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
    scan = re.compile(rf"^SCAN {re.escape(table)}\b(?!.*USING)")
    return [row[3] for row in cursor.fetchall() if scan.search(row[3])]


@pytest.mark.parametrize("finished", [0, 100_000], ids=["empty", "100k-finished"])
@pytest.mark.parametrize("kind", ["mysql", "sqlite"])
def test_mariadb_and_sqlite_plans_read_an_index(kind: str, finished: int, tmp_path: Path) -> None:
    """No plan caching here (PyMySQL and sqlite3 prepare nothing across
    runs), so each statement is planned with the table as it is: checked
    on a new table and beside 100,000 finished rows, statistics never
    gathered (no ANALYZE on SQLite; on MariaDB, InnoDB's own)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'queue.db'}"
    else:
        url = str(normalize_url(server_url("mysql")).render_as_string(hide_password=False))
    app = build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tenant",))
    seen = Seen(app.Task.__tablename__)
    explain = _sqlite_full_scans if kind == "sqlite" else _mysql_full_scans
    with captured(url, seen, explain) as engine:
        app.Base.metadata.create_all(engine)
        try:
            plain = create_engine(url)
            try:
                _finished_rows(plain, seen.table, finished)
                seen.plans.clear()
                exercise(engine, app, plain)
            finally:
                plain.dispose()
        finally:
            app.Base.metadata.drop_all(engine)
    assert seen.explained > 30
    assert [f"{statement}\n{plan}" for statement, plan in seen.plans] == []
