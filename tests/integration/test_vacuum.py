"""The vacuum routine: VACUUM when the queue table's dead tuples pass the
threshold, a warning naming the holder when an old snapshot would keep them,
and nothing at all off PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sqla_queue.maintenance import VacuumConfig, VacuumRoutine
from sqla_queue.maintenance.timing import Every
from sqla_queue.mixins import STORAGE_PARAMETERS
from sqla_queue.settings import Settings
from sqla_queue.worker import Runner
from tests.adapters.test_plans import make_dead_tuples
from tests.conftest import wait_until
from tests.support.app import App


def _routine(engine: Engine, app: App, **config: float) -> VacuumRoutine:
    adapter = Runner(app.RecordingWorker(), engine=engine, settings=Settings()).adapter
    return VacuumRoutine(engine, adapter, Every(60), VacuumConfig(**config))  # type: ignore[arg-type]


def _dead(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = :t"), {"t": table}
            ).scalar()
            or 0
        )


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_vacuum_runs_past_the_threshold_and_frees_the_dead_tuples(engine: Engine, app: App) -> None:
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


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_vacuum_held_back_by_an_old_snapshot_warns_and_names_the_holder(
    engine: Engine, app: App, caplog: pytest.LogCaptureFixture
) -> None:
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
        assert "relatorio-longo" in caplog.text and "holds the oldest snapshot" in caplog.text
        holder.rollback()
    assert routine.run_once().counts["vacuumed"] == 1
    wait_until(lambda: _dead(engine, table) == 0, message="the vacuum to free them")


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
