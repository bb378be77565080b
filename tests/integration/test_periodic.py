"""Periodic tasks (sqla_queue.Periodic): each due occurrence enqueued once
by the fleet, missed ones collapsed into the latest, listed by status."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select

from sqla_queue import ConfigurationError, Periodic, QueueApp
from sqla_queue.adapters import adapter_of
from sqla_queue.config.settings import Settings
from sqla_queue.maintenance import ManualClock
from sqla_queue.maintenance.periodic import PERIODIC_SETTING, last_runs
from sqla_queue.schema.configuration_table import configuration_table_of
from tests.acceptance.test_concurrency import spawned, stop_gracefully, worker_env
from tests.conftest import run_cli, wait_until
from tests.support.app import App

T0 = dt.datetime(2026, 3, 2, 10, 2, 30, tzinfo=dt.timezone.utc)


@pytest.fixture
def markers(engine: Engine, app: App) -> Iterator[Any]:
    """The queue's configuration table, which the routine creates; dropped after."""
    table = configuration_table_of(app.Task)
    try:
        yield table
    finally:
        table.drop(engine, checkfirst=True)


def _worker(app: App, *periodic: Periodic) -> Any:
    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        pass

    Billing.periodic = list(periodic)
    return Billing


def _routine(engine: Engine, worker: Any, clock: ManualClock) -> Any:
    parts = QueueApp(worker(), engine=engine, settings=Settings(), clock=clock)
    return parts.maintenance.routine("periodic")


def _enqueued(engine: Engine, app: App) -> list[tuple[str, dt.datetime, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(app.Task.external_key, app.Task.run_at, app.Task.payload_text)
            .where(app.Task.external_key.like("periodic:%"))
            .order_by(app.Task.run_at, app.Task.external_key)
        ).all()
    return [
        (key, run_at.astimezone(dt.timezone.utc), json.loads(text) if text else None)
        for key, run_at, text in rows
    ]


def _at(hour: int, minute: int) -> dt.datetime:
    return T0.replace(hour=hour, minute=minute, second=0)


def test_each_occurrence_once_and_missed_ones_collapse_into_the_latest(
    engine: Engine, app: App, installed: None, markers: Any
) -> None:
    worker = _worker(
        app,
        Periodic("five", "*/5 * * * *", process="faturar", payload={"n": 5}),
        Periodic("hourly", "0", process="faturar", priority=80),  # the seed's minute list
    )
    clock = ManualClock(T0)
    routine = _routine(engine, worker, clock)

    # first sight: both start from their current occurrence, nothing enqueued
    assert routine.run_once().counts == {"enqueued": 0, "started": 2}
    assert _enqueued(engine, app) == []
    with engine.connect() as conn:  # status: nothing enqueued yet, so no last run
        assert last_runs(conn, adapter_of(conn.dialect, app.Task.__table__), markers) == {}
    clock.set(_at(10, 5))
    assert routine.run_once().counts["enqueued"] == 1
    clock.set(_at(10, 5) + dt.timedelta(seconds=40))
    assert routine.run_once().counts["enqueued"] == 0  # the same occurrence
    assert _enqueued(engine, app) == [("periodic:five", _at(10, 5), {"n": 5})]

    # down from 10:06 to 10:21: 10:10, 10:15 and 10:20 missed; only 10:20 runs
    clock.set(_at(10, 21))
    assert routine.run_once().counts["enqueued"] == 1
    assert [at for _, at, _ in _enqueued(engine, app)] == [_at(10, 5), _at(10, 20)]

    clock.set(_at(11, 0))
    assert routine.run_once().counts["enqueued"] == 2
    # another process, which knows nothing yet: the database says it is done
    other = _routine(engine, worker, clock)
    assert other.run_once().counts == {"enqueued": 0, "started": 0}

    found = _enqueued(engine, app)
    assert found[-2:] == [
        ("periodic:five", _at(11, 0), {"n": 5}),
        ("periodic:hourly", _at(11, 0), None),
    ]
    with engine.connect() as conn:
        priority = conn.execute(
            select(app.Task.priority).where(app.Task.external_key == "periodic:hourly")
        ).scalar_one()
        assert priority == 80
        adapter = adapter_of(conn.dialect, app.Task.__table__)
        assert last_runs(conn, adapter, markers) == {
            "five": _at(11, 0),
            "hourly": _at(11, 0),
        }
        setting = conn.execute(
            select(markers.c.setting_name).where(markers.c.setting_name == PERIODIC_SETTING)
        ).scalar_one()
        assert setting == PERIODIC_SETTING
    # the tasks are ordinary tasks: a worker runs them (one without periodic
    # tasks: a periodic routine on the real clock would enqueue today's
    # occurrence, which the burst could leave behind)
    assert app.RecordingWorker().run(engine=engine, burst=True, settings=Settings()) == 0
    with engine.connect() as conn:
        statuses = conn.execute(
            select(app.Task.status).where(app.Task.external_key.like("periodic:%"))
        ).scalars()
        assert set(statuses) == {"sucesso"}


def test_concurrent_rounds_enqueue_an_occurrence_once(
    engine: Engine, app: App, installed: None, markers: Any
) -> None:
    """Four processes' routines (an engine each) racing at the same
    occurrences, without the routine lock: the database lets one enqueue."""
    worker = _worker(app, Periodic("minute", "* * * * *", process="faturar"))
    clock = ManualClock(T0)
    url = engine.url.render_as_string(hide_password=False)
    engines = [create_engine(url) for _ in range(4)]
    try:
        routines = [_routine(other, worker, clock) for other in engines]
        routines[0].run_once()  # first sight
        errors: list[BaseException] = []
        for minute in range(3, 9):
            clock.set(_at(10, minute) + dt.timedelta(seconds=1))
            barrier = threading.Barrier(len(routines))

            def race(routine: Any, barrier: threading.Barrier) -> None:
                try:
                    barrier.wait(timeout=30)
                    routine.run_once()
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=race, args=(r, barrier)) for r in routines]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert not errors, errors
    finally:
        for other in engines:
            other.dispose()
    assert [at for _, at, _ in _enqueued(engine, app)] == [_at(10, m) for m in range(3, 9)]


def test_a_fleet_of_worker_processes_enqueues_each_occurrence_once(
    engine: Engine, app: App, db_url: str, markers: Any
) -> None:
    env = worker_env(app.Task.__table__.name)
    args = ("worker", "tests.support.periodic_app:TickWorker", "--url", db_url)
    with spawned(*args, env=env, count=3) as workers:
        wait_until(lambda: len(_enqueued(engine, app)) >= 3, timeout=60, message="3 ticks")
        stop_gracefully(workers)
    ticks = [at for _, at, _ in _enqueued(engine, app)]
    assert len(ticks) == len(set(ticks)), ticks  # no occurrence twice
    assert all(at.microsecond == 0 for at in ticks)


def test_status_lists_the_periodic_tasks_with_their_next_run(
    engine: Engine, app: App, db_url: str, markers: Any
) -> None:
    env = worker_env(app.Task.__table__.name)
    worker = "tests.support.periodic_app:TickWorker"
    data = json.loads(run_cli("status", worker, "--url", db_url, "--json", env=env).stdout)
    [tick] = data["periodic"]
    assert (tick["name"], tick["schedule"], tick["process"]) == ("tick", "@every 1s", "faturar")
    assert tick["last_enqueued"] is None
    # the next fire time after the moment the status was taken (a second at most)
    taken = dt.datetime.fromisoformat(data["taken_at"])
    after = dt.datetime.fromisoformat(tick["next_run"]) - taken
    assert dt.timedelta(0) < after <= dt.timedelta(seconds=1)
    assert "tick" in run_cli("status", worker, "--url", db_url, env=env).stdout


@pytest.mark.parametrize(
    ("periodic", "message"),
    [
        ("0 3 * * *", "must be a list of Periodic"),
        ([("a", "0 3 * * *")], "must hold Periodic objects"),
        (
            [Periodic("a", "0", process="p"), Periodic("a", "1", process="p")],
            "names a more than once",
        ),
    ],
)
def test_a_bad_declaration_is_one_clear_error(app: App, periodic: Any, message: str) -> None:
    worker = _worker(app)
    worker.periodic = periodic
    with pytest.raises(ConfigurationError, match=message):
        worker.check_configuration()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_maintenance_run_periodic_by_hand(
    engine: Engine, app: App, db_url: str, markers: Any
) -> None:
    env = worker_env(app.Task.__table__.name)
    args = ("maintenance", "run", "periodic")
    done = run_cli(*args, "tests.support.periodic_app:TickWorker", "--url", db_url, env=env)
    assert "periodic: enqueued 0, started 1" in done.stdout
    refused = run_cli(
        *args, "tests.support.app:RecordingWorker", "--url", db_url, env=env, check=False
    )
    assert refused.returncode == 1
    assert "declares no periodic tasks" in refused.stderr and "Traceback" not in refused.stderr
