"""The vacuum routine: VACUUM when the queue table's dead tuples pass the
threshold, a warning naming the holder when something holds the vacuum
horizon (a snapshot, a transaction id without one, a prepared transaction,
a replication slot, a standby), and nothing at all off PostgreSQL.

The PostgreSQL tests run on a cluster of their own (``private_postgres``):
on the shared server another suite's transaction holds the horizon now and
then (``horizon_seconds=0`` makes any transaction a holder, and a vacuum
frees nothing while one runs); and prepared transactions, logical slots and
a standby need settings that the shared server does not have
(``max_prepared_transactions = 0``, ``wal_level = replica``) and must keep."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import Engine, text

from sqla_queue.config.settings import Settings
from sqla_queue.config.timing import Every
from sqla_queue.maintenance import ManualClock, VacuumConfig, VacuumRoutine
from sqla_queue.maintenance.clock import Clock
from sqla_queue.schema.mixins import STORAGE_PARAMETERS
from sqla_queue.worker import Runner
from tests.adapters.test_plans import make_dead_tuples
from tests.conftest import wait_until
from tests.support.app import App
from tests.support.servers import PrivatePostgres, _user_kwargs


def _routine(
    engine: Engine, app: App, clock: Clock | None = None, **config: float
) -> VacuumRoutine:
    adapter = Runner.for_worker(app.RecordingWorker(), engine=engine, settings=Settings()).adapter
    return VacuumRoutine(engine, adapter, Every(60), VacuumConfig(**config), clock=clock)  # type: ignore[arg-type]


def _dead(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = :t"), {"t": table}
            ).scalar()
            or 0
        )


def _private(server: PrivatePostgres, app: App, **settings: str) -> Engine:
    """An engine on ``server`` with the app's tables, after ``settings``
    (ALTER SYSTEM, then a restart: the cluster is the test's own)."""
    if settings:
        with server.connect() as admin:
            for name, value in settings.items():
                admin.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        server.restart()
    engine = server.engine()
    app.Base.metadata.create_all(engine)
    return engine


def test_vacuum_runs_past_the_threshold_and_frees_the_dead_tuples(
    private_postgres: PrivatePostgres, app: App
) -> None:
    engine = _private(private_postgres, app)
    table = app.Task.__tablename__
    routine = _routine(engine, app, dead_tuples=5000)
    make_dead_tuples(engine, table, 3000)
    wait_until(lambda: _dead(engine, table) >= 3000, message="the statistics to count 3000")
    below = routine.run_once()
    assert below.counts["vacuumed"] == 0 and below.counts["dead_tuples"] >= 3000
    make_dead_tuples(engine, table, 3000)
    wait_until(lambda: _dead(engine, table) >= 6000, message="the statistics to count 6000")
    assert routine.run_once(dry_run=True).counts["vacuumed"] == 1
    assert _dead(engine, table) >= 6000  # a dry run changes nothing
    result = routine.run_once()
    assert result.counts["vacuumed"] == 1 and result.counts["dead_tuples"] >= 6000
    wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")


def test_vacuum_held_back_by_an_old_snapshot_warns_and_names_the_holder(
    private_postgres: PrivatePostgres, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _private(private_postgres, app)
    table = app.Task.__tablename__
    routine = _routine(engine, app, dead_tuples=100, horizon_seconds=0)
    with engine.connect() as holder:
        holder.execute(text("SET application_name = 'relatorio-longo'"))
        holder.commit()
        holder.execution_options(isolation_level="REPEATABLE READ")
        holder.execute(text(f"SELECT count(*) FROM {table}"))  # takes the snapshot
        make_dead_tuples(engine, table, 500)
        wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
        with caplog.at_level(logging.WARNING, logger="sqla_queue.maintenance"):
            blocked = routine.run_once()
        assert blocked.counts["vacuumed"] == 0 and blocked.counts["blocked"] == 1
        assert "relatorio-longo" in caplog.text and "holds the vacuum horizon" in caplog.text
        holder.rollback()
    assert routine.run_once().counts["vacuumed"] == 1
    wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("vacuum of")
    ]


def _vacuum_now(engine: Engine, table: str) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'VACUUM "{table}"'))


def test_vacuum_held_back_by_a_transaction_id_without_a_snapshot_warns_once_and_names_it(
    private_postgres: PrivatePostgres, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's pin: a session that wrote (BEGIN; SELECT txid_current())
    and sits idle in transaction in READ COMMITTED has its transaction id
    but no snapshot (backend_xmin NULL): it still holds the horizon."""
    engine = _private(private_postgres, app)
    table = app.Task.__tablename__
    routine = _routine(engine, app, dead_tuples=100, horizon_seconds=0)
    with engine.connect() as holder:
        holder.execute(text("SET application_name = 'harness'"))
        holder.commit()
        holder.execute(text("SELECT txid_current()"))
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        holder.execute(text("SELECT 'segredo-42'"))  # its last query text: never logged
        make_dead_tuples(engine, table, 500)
        wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
        with engine.connect() as look:
            seen = look.execute(
                text(
                    "SELECT state, backend_xid IS NOT NULL, backend_xmin IS NULL"
                    " FROM pg_stat_activity WHERE pid = :pid"
                ),
                {"pid": pid},
            ).one()
        assert tuple(seen) == ("idle in transaction", True, True)
        with caplog.at_level(logging.DEBUG, logger="sqla_queue.maintenance"):
            rounds = [routine.run_once(), routine.run_once()]
        assert [(r.counts["vacuumed"], r.counts.get("blocked")) for r in rounds] == [(0, 1)] * 2
        [warning] = _warnings(caplog)  # once for the pin, not once a round
        assert f"pid {pid} (idle in transaction, client backend, application 'harness', " in warning
        assert "a transaction id and no snapshot" in warning
        assert "holds the vacuum horizon" in warning and "segredo" not in caplog.text
        # the routine is right: a VACUUM now frees none of them
        _vacuum_now(engine, table)
        assert _dead(engine, table) >= 500
        holder.rollback()
    assert routine.run_once().counts["vacuumed"] == 1
    wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")


def test_vacuum_held_back_by_a_prepared_transaction_names_its_gid(
    private_postgres: PrivatePostgres, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _private(private_postgres, app, max_prepared_transactions="2")
    table = app.Task.__tablename__
    routine = _routine(engine, app, dead_tuples=100, horizon_seconds=0)
    gid = "lote\n42"  # the application's text: the warning stays one line
    with private_postgres.connect() as prepared:
        prepared.execute("BEGIN")
        prepared.execute("SELECT txid_current()")
        prepared.execute(sql.SQL("PREPARE TRANSACTION {}").format(gid))
    try:
        make_dead_tuples(engine, table, 500)
        wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
        with caplog.at_level(logging.WARNING, logger="sqla_queue.maintenance"):
            blocked = routine.run_once()
        assert blocked.counts["vacuumed"] == 0 and blocked.counts["blocked"] == 1
        [warning] = _warnings(caplog)
        assert "prepared transaction 'lote\\x0a42' (owner postgres) for " in warning
        assert "\n" not in warning
    finally:
        with private_postgres.connect() as admin:
            admin.execute(sql.SQL("ROLLBACK PREPARED {}").format(gid))
    assert routine.run_once().counts["vacuumed"] == 1
    wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")


def test_slots_without_an_xmin_do_not_hold_the_vacuum(
    private_postgres: PrivatePostgres, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """A physical slot that only reserves WAL, and a logical slot, whose
    catalog_xmin holds back the catalogs' vacuum, not the queue table's:
    the routine vacuums, and the vacuum frees the dead tuples."""
    engine = _private(private_postgres, app, wal_level="logical")
    table = app.Task.__tablename__
    routine = _routine(engine, app, dead_tuples=100, horizon_seconds=0)
    with private_postgres.connect() as admin:
        admin.execute("SELECT pg_create_physical_replication_slot('sqlaq_physical', true)")
        admin.execute("SELECT pg_create_logical_replication_slot('sqlaq_logical', 'pgoutput')")
        try:
            make_dead_tuples(engine, table, 500)
            slots = admin.execute(
                "SELECT slot_name, xmin IS NULL, catalog_xmin IS NOT NULL,"
                " restart_lsn IS NOT NULL FROM pg_replication_slots ORDER BY slot_name"
            ).fetchall()
            assert slots == [
                ("sqlaq_logical", True, True, True),
                ("sqlaq_physical", True, False, True),
            ]
            wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
            with caplog.at_level(logging.WARNING, logger="sqla_queue.maintenance"):
                assert routine.run_once().counts["vacuumed"] == 1
            assert _warnings(caplog) == []
            wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")
        finally:
            admin.execute("SELECT pg_drop_replication_slot('sqlaq_physical')")
            admin.execute("SELECT pg_drop_replication_slot('sqlaq_logical')")


@contextlib.contextmanager
def _standby(primary: PrivatePostgres, slot: str | None) -> Iterator[PrivatePostgres]:
    """A hot standby of ``primary`` (pg_basebackup), its feedback on and sent
    every second; through the physical replication ``slot`` (made for it) if
    given."""
    standby = PrivatePostgres(primary.bindir, None, prefix="sqlaq-standby-")
    try:
        command = [str(primary.bindir / "pg_basebackup"), "-D", str(standby.data_dir)]
        command += ["-h", primary.host, "-p", str(primary.port), "-U", primary.user]
        command += ["-R", "-X", "stream", "-c", "fast", "--no-sync"]
        if slot is not None:
            command += ["-C", "-S", slot]
        done = subprocess.run(
            command,
            cwd=standby.workdir,
            capture_output=True,
            text=True,
            timeout=60,
            **_user_kwargs(standby.os_user),
        )
        assert done.returncode == 0, done.stderr
        with (standby.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write("hot_standby_feedback = on\nwal_receiver_status_interval = 1\n")
        standby.start()
        yield standby
    finally:
        standby.close()


@pytest.mark.parametrize("slot", [None, "sqlaq_standby"], ids=["no-slot", "slot"])
def test_vacuum_held_back_by_a_standby_names_it_once_it_has_held_the_horizon(
    private_postgres: PrivatePostgres, app: App, caplog: pytest.LogCaptureFixture, slot: str | None
) -> None:
    """A standby's query, through hot_standby_feedback: the walsender's xmin
    (pg_stat_replication) or its slot's. They carry no time: the routine ages
    them by the transaction ids it noted at its rounds."""
    engine = _private(private_postgres, app)
    table = app.Task.__tablename__
    now = _routine(engine, app, dead_tuples=100, horizon_seconds=0)
    clock = ManualClock()
    aged = _routine(engine, app, clock=clock, dead_tuples=100, horizon_seconds=60)
    expected = f"replication slot '{slot}' (physical, active)" if slot else "standby 'walreceiver'"
    with (
        _standby(private_postgres, slot) as standby,
        # a statement a transaction: a transaction left open would hold the horizon too
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as look,
    ):

        def fed_back() -> bool:
            query = (
                "SELECT xmin FROM pg_replication_slots" if slot
                else "SELECT backend_xmin FROM pg_stat_replication"
            )  # fmt: skip
            return look.execute(text(query)).scalar() is not None

        wait_until(fed_back, message="the standby's feedback")
        with standby.connect() as query:
            query.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            query.execute(f'SELECT count(*) FROM "{table}"')  # the standby's snapshot
            make_dead_tuples(engine, table, 500)
            wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
            with caplog.at_level(logging.WARNING, logger="sqla_queue.maintenance"):
                blocked = now.run_once()
                # no round of its 60 s ago yet: nothing says how long the standby has held
                assert aged.run_once(dry_run=True).counts.get("blocked") is None
                clock.advance(61)
                assert aged.run_once(dry_run=True).counts.get("blocked") == 1
            assert blocked.counts["vacuumed"] == 0 and blocked.counts["blocked"] == 1
            warnings = _warnings(caplog)
            assert len(warnings) == 2 and all(expected in w for w in warnings), warnings
            _vacuum_now(engine, table)
            assert _dead(engine, table) >= 500  # it does hold them
            query.execute("COMMIT")
        # its feedback moves on within a second: the vacuum runs, and frees them
        wait_until(lambda: now.run_once().counts["vacuumed"] == 1, message="the vacuum to run")
        wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")
        # the standby's xmin now is younger than the round of 60 s ago: not a holder
        make_dead_tuples(engine, table, 500)
        wait_until(lambda: _dead(engine, table) >= 500, message="the statistics to count 500")
        clock.advance(61)
        young = aged.run_once(dry_run=True).counts
        assert young["vacuumed"] == 1 and "blocked" not in young


@pytest.mark.parametrize("db_url", ["sqlite", "mysql"], indirect=True)
def test_vacuum_does_nothing_off_postgresql(engine: Engine, app: App) -> None:
    result = _routine(engine, app, dead_tuples=1).run_once()
    assert result.counts == {"dead_tuples": 0, "vacuumed": 0}


def _reloptions(conn: Any, table: str) -> set[str]:
    options = conn.execute(
        text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}
    ).scalar()
    return set(options or [])


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_storage_parameters_come_with_create_all_and_the_alembic_operation(
    engine: Engine, app: App
) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    import sqla_queue.alembic  # noqa: F401  (registers the operations)

    expected = {f"{name}={value}" for name, value in STORAGE_PARAMETERS}
    table = app.Task.__tablename__
    with engine.begin() as conn:
        assert _reloptions(conn, table) == expected
        conn.execute(text(f"ALTER TABLE {table} RESET (fillfactor)"))
        operations = Operations(MigrationContext.configure(conn))
        operations.drop_queue_notify_trigger(table, channel=table)
        operations.create_queue_notify_trigger(table, channel=table)
        assert _reloptions(conn, table) == expected
