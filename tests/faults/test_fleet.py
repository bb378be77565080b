"""The acceptance run: a long-running fleet through a database restart.

Four worker processes (the real CLI, two lanes each) consume a queue on a
PostgreSQL cluster of the test's own while tasks keep arriving, the
database is restarted, and their connections are terminated again and
again. Every task must run its effect exactly once (0 lost, 0 twice) and no
worker may exit.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import QueueClient
from tests.acceptance.test_concurrency import (
    effects,
    spawned,
    statuses,
    stop_gracefully,
    worker_env,
)
from tests.conftest import WORKER_CLASSES, wait_until
from tests.support.app import App, build
from tests.support.servers import PrivatePostgres

OPEN = {"agendada", "pendente", "processando"}


@pytest.fixture(params=["sync", "async", "fair"])
def fleet(request: pytest.FixtureRequest) -> str:
    """The fleet's worker: sync, async, or sync with fair claims by tenant
    and per-tenant concurrency and rate limits (tests/support/limits_app.py)."""
    return str(request.param)


def test_fleet_survives_a_restart_and_terminated_connections_exactly_once(
    private_postgres: PrivatePostgres, table_name: str, fleet: str
) -> None:
    fair = fleet == "fair"
    app = build(table_name, fair_by=("tenant",) if fair else ())
    engine = private_postgres.engine(pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    env = worker_env(
        table_name, SQLA_QUEUE_TEST_LEASE="3", SQLA_QUEUE_TEST_FAIR_BY="tenant" if fair else ""
    )
    worker = (
        "tests.support.limits_app:FairFleetWorker" if fair else WORKER_CLASSES[fleet]["recording"]
    )
    ids: list[int] = []

    def enqueue(count: int) -> None:
        if not fair:
            # mixed durations: one in 40 works 0.3 s, half of those after a
            # first read (its transaction open meanwhile), the rest nothing
            with engine.begin() as conn:
                ids.extend(
                    QueueClient(conn, app.Task).insert_tasks(
                        {"process": "bulk", "payload": _mixed(len(ids) + n)} for n in range(count)
                    )
                )
            return
        # half as many: each fair claim takes a lock and a count per tenant;
        # four tenants, and tasks without one
        with engine.begin() as conn:
            ids.extend(
                QueueClient(conn, app.Task).insert_tasks(
                    {"process": "bulk", "tenant": n % 5 or None, "payload": {"n": n}}
                    for n in range(count // 2)
                )
            )

    with spawned(
        "worker",
        worker,
        "--url",
        private_postgres.url,
        "--concurrency",
        "2",
        "--log-level",
        "WARNING",
        env=env,
        count=4,
    ) as workers:
        enqueue(500)
        wait_until(lambda: "sucesso" in statuses(engine, app).values(), message="a first task")
        for round_ in range(3):
            enqueue(500)
            private_postgres.terminate_backends()
            enqueue(200)
            if round_ == 1:
                private_postgres.restart("fast")
                engine.dispose()  # the test's own pool died with the server too
                enqueue(300)
        wait_until(
            lambda: not OPEN & set(statuses(engine, app).values()),
            timeout=90,
            message="every task to finish",
        )
        stop_gracefully(workers)

    assert_each_chain_ran_once(engine, app, ids)
    engine.dispose()


def _mixed(n: int) -> dict[str, Any]:
    if n % 40:
        return {"n": n}
    return {"n": n, "sleep": 0.3, "touch": n % 80 == 0}


def assert_each_chain_ran_once(engine: Engine, app: App, ids: list[int]) -> list[Any]:
    """Each chain of ``ids`` finished once (0 lost, none twice) and each
    finished attempt left one effect. Returns the rows (id, initial_id, status)."""
    with Session(engine) as session:
        rows = session.query(app.Task.id, app.Task.initial_id, app.Task.status).all()
    finished = {task_id for task_id, _, status in rows if status == "sucesso"}
    chains = sorted(
        initial_id or task_id for task_id, initial_id, status in rows if status == "sucesso"
    )
    done = effects(engine, app)
    assert chains == sorted(ids)
    assert sorted(task_id for task_id, _, _ in done) == sorted(finished)
    return list(rows)


def test_a_rate_limited_worker_started_while_the_database_is_down_waits_for_it(
    private_postgres: PrivatePostgres, table_name: str
) -> None:
    """Its token buckets' table is made at the first claim, not at start:
    a fleet restarted with its database comes up with it."""
    app = build(table_name, fair_by=("tenant",))
    engine = private_postgres.engine(pool_pre_ping=True)
    app.Base.metadata.create_all(engine)  # the configuration table is left to the worker
    engine.dispose()
    private_postgres.stop()
    env = worker_env(table_name, SQLA_QUEUE_TEST_LEASE="3", SQLA_QUEUE_TEST_FAIR_BY="tenant")
    with spawned(
        "worker",
        "tests.support.limits_app:FairFleetWorker",
        "--url",
        private_postgres.url,
        "--concurrency",
        "2",
        env=env,
    ) as (worker,):
        wait_until(
            lambda: "buckets not ready" in worker.output or worker.proc.poll() is not None,
            message="the worker to find the database down",
        )
        assert worker.proc.poll() is None, worker.output
        private_postgres.start()
        with engine.begin() as conn:
            ids = QueueClient(conn, app.Task).insert_tasks(
                {"process": "bulk", "tenant": n % 3 or None, "payload": {"n": n}} for n in range(60)
            )
        wait_until(
            lambda: set(statuses(engine, app).values()) == {"sucesso"},
            timeout=60,
            message="every task to finish",
        )
        stop_gracefully([worker])
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == sorted(ids)
    engine.dispose()
