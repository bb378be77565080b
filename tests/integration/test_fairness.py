"""Per-key fairness (sqla_queue/fairness.py, docs/fairness.md) on SQLite,
PostgreSQL and MariaDB: a tenant's backlog does not starve another
tenant's tasks, or the tasks without a tenant; the keys go round."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, select

from sqla_queue import ConfigurationError, QueueClient, WorkerBase
from sqla_queue.adapters.fairness import FairnessQueries
from sqla_queue.settings import Settings
from sqla_queue.worker import Runner
from tests.acceptance.test_concurrency import spawned, worker_env
from tests.conftest import created_engine
from tests.support.app import App, build
from tests.support.limits_app import LIMIT, most_at_once

BACKLOG = 300


@pytest.fixture
def fapp() -> App:
    return build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tenant",))


@pytest.fixture
def fengine(db_url: str, fapp: App) -> Any:
    with created_engine(db_url, fapp.Base.metadata) as engine:
        yield engine


def enqueue(engine: Engine, app: App, tenant: int | None, count: int) -> list[int]:
    with engine.begin() as conn:
        return QueueClient(conn, app.Task).insert_tasks(
            [{"process": "p", "tenant": tenant, "payload": {"n": n}} for n in range(count)]
        )


def run_order(engine: Engine, app: App) -> list[int]:
    """The task ids in the order their handlers ran."""
    with engine.connect() as conn:
        return list(conn.execute(select(app.Effect.task_id).order_by(app.Effect.id)).scalars())


def drain(worker: type[WorkerBase], engine: Engine) -> None:
    assert Runner(worker(), engine=engine, burst=True, settings=Settings()).run() == 0


@pytest.mark.parametrize("fair", [True, False])
def test_a_big_backlog_does_not_starve_a_small_tenant(
    fengine: Engine, fapp: App, fair: bool
) -> None:
    big = enqueue(fengine, fapp, 1, BACKLOG)  # older: first in plain claim order
    small = enqueue(fengine, fapp, 2, 10)
    keyless = enqueue(fengine, fapp, None, 5)

    class Worker(fapp.RecordingWorker):  # type: ignore[name-defined,misc]
        batch_size = 10
        fair_by = "tenant" if fair else None

    drain(Worker, fengine)
    order = run_order(fengine, fapp)
    assert sorted(order) == sorted(big + small + keyless)  # each once
    position = {task_id: n for n, task_id in enumerate(order)}
    last_small = max(position[i] for i in small)
    last_keyless = max(position[i] for i in keyless)
    if fair:
        # every claim takes a share of each: the small tenant's ten and the
        # five without a tenant are done within the first few batches
        assert last_small < 60 and last_keyless < 60, (last_small, last_keyless)
        # and within a key, claim order holds
        assert [i for i in order if i in set(small)] == small
    else:  # the control: plain claim order runs the backlog first
        assert min(position[i] for i in small) >= BACKLOG


def test_the_keys_go_round(fengine: Engine, fapp: App) -> None:
    for tenant in (5, 1, 3, 2):
        enqueue(fengine, fapp, tenant, 2)
    enqueue(fengine, fapp, None, 1)
    queries = FairnessQueries(fapp.Task.__table__, "tenant")
    with fengine.connect() as conn:
        assert queries.keys(conn, after=None, limit=2) == [1, 2]
        assert queries.keys(conn, after=2, limit=3) == [3, 5, 1]
        assert queries.keys(conn, after=5, limit=10) == [1, 2, 3, 5]
        assert queries.keys(conn, after=3, limit=10) == [5, 1, 2, 3]
        assert queries.keys(conn, after=9, limit=1) == [1]
        assert queries.unkeyed(conn)


def test_the_fair_index_is_made(fengine: Engine, fapp: App) -> None:
    table = fapp.Task.__table__.name
    names = {index["name"] for index in inspect(fengine).get_indexes(table)}
    wanted = f"ix_{table}_status_justo_tenant" if fengine.dialect.name == "mysql" else None
    assert (wanted or f"ix_{table}_justo_tenant") in names


def test_fair_by_needs_the_models_declaration(app: App, engine: Engine) -> None:
    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "tenant"

    with pytest.raises(ConfigurationError) as error:
        Runner(Worker(), engine=engine, settings=Settings())
    table = app.Task.__table__.name
    assert str(error.value) == (
        f"Worker.fair_by = 'tenant': add it to Task.__queue_fair_by__ (the index of a fair "
        f"claim: ix_{table}_justo_tenant) and create it"
    )

    class Typo(app.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "tennant"

    with pytest.raises(ConfigurationError, match=r"Typo\.fair_by must be the name of a column"):
        Runner(Typo(), engine=engine, settings=Settings())


def test_a_bad_declaration_is_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="'tennant' is not a column of"):
        build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tennant",)).Base.registry.configure()


def test_a_key_never_runs_past_its_limit_across_the_fleet(
    fengine: Engine, fapp: App, db_url: str, tmp_path: Path
) -> None:
    """4 processes of 4 lanes, two tenants of 40 tasks, 40 tasks without a
    tenant (not limited: they keep the lanes busy side by side, so that an
    excess could be seen) and a limit of 2 running tasks per tenant: never
    more than 2 of one tenant at once, more than 2 in all (not on SQLite:
    one batch at a time), each once."""
    for tenant in (1, 2, None):
        enqueue(fengine, fapp, tenant, 40)
    env = worker_env(
        fapp.Task.__table__.name,
        SQLA_QUEUE_TEST_PROBE=str(tmp_path),
        SQLA_QUEUE_TEST_FAIR_BY="tenant",
    )
    args = ("worker", "tests.support.limits_app:KeyLimitedWorker", "--url", db_url)
    with spawned(*args, "--concurrency", "4", "--burst", env=env, count=4) as workers:
        for process in workers:
            assert process.wait(timeout=90) == 0, process.output
    done = run_order(fengine, fapp)
    assert len(done) == len(set(done)) == 120  # each once
    for tenant in (1, 2):
        assert 1 <= most_at_once(tmp_path, f"tenant-{tenant}") <= LIMIT
    if fengine.dialect.name != "sqlite":
        assert most_at_once(tmp_path, "all") > LIMIT


def test_a_key_limit_needs_fair_by(app: App, engine: Engine) -> None:
    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        key_concurrency_limit = 2

    with pytest.raises(ConfigurationError) as error:
        Runner(Worker(), engine=engine, settings=Settings())
    assert str(error.value) == (
        "Worker.key_concurrency_limit limits the tasks of each key of fair_by: set fair_by"
    )

    class Zero(app.RecordingWorker):  # type: ignore[name-defined,misc]
        key_concurrency_limit = 0

    with pytest.raises(ConfigurationError, match="must be a whole number of at least 1, not 0"):
        Runner(Zero(), engine=engine, settings=Settings())
