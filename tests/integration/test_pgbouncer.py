"""Workers behind a real PgBouncer (Debian's 1.18), in session and transaction pooling.

Transaction pooling hands each transaction (each autocommit statement) to
any server connection: session-level advisory locks land on whatever server
session the pooler picked, so a rescue that *tries* a task's lock succeeds
re-entrantly on the very session that holds a live task's lock. The rescue
reads pg_locks instead, and trusts the lease; see docs/pgbouncer.md.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from tests.acceptance.test_concurrency import (
    effects,
    insert_tasks,
    spawned,
    statuses,
    stop_gracefully,
    worker_env,
)
from tests.conftest import wait_until
from tests.integration.test_claims import rescue, runner
from tests.integration.test_worker import enqueue, tasks
from tests.support.app import App
from tests.support.servers import PgBouncer

RECORDING = "tests.support.app:RecordingWorker"
postgresql = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


@postgresql
def test_rescue_behind_transaction_pooling_leaves_a_live_task_alone(
    engine: Engine, app: App, installed: None, pgbouncer_factory: Callable[..., PgBouncer]
) -> None:
    """One server connection: the worker's claim takes the task's advisory
    lock on it, and the other worker's rescue runs on that same server
    session. A pg_try_advisory_lock there succeeds (the reproduced bug:
    the task ran twice); the lock is held, so the task is not lost."""
    bouncer = pgbouncer_factory("transaction", pool_size=1)
    pooled = bouncer.engine()
    try:
        [task_id] = enqueue(engine, app, {"n": 1})
        live, other = runner(app.RecordingWorker, pooled), runner(app.RecordingWorker, pooled)
        assert live.adapter.task_locks  # the default, as a user would start
        with live.adapter.connect_claim(pooled) as claim, pooled.connect() as work:
            running = live.manager.claim(claim, limit=1)
            assert rescue(other) == 0
            result = live.manager.run_batch(claim, work, running, live.worker.dispatch)
        assert result.succeeded == 1
        assert [(t.id, t.status) for t in tasks(engine, app)] == [(task_id, "sucesso")]
        assert len(effects(engine, app)) == 1
    finally:
        pooled.dispose()


@postgresql
@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_workers_behind_pgbouncer_run_every_task_once(
    engine: Engine,
    app: App,
    table_name: str,
    mode: str,
    pgbouncer_factory: Callable[..., PgBouncer],
) -> None:
    """The documented set-up: in transaction pooling, task locks off and
    psycopg's prepared statements off (``?prepare_threshold=none``); in
    session pooling, nothing to change. Two long-running worker processes of
    two lanes each, while the pooler's server connections are cut."""
    # session pooling gives each client a server connection for life: the
    # pool must hold every worker connection (2 x (2 lanes x 2 + 3) + LISTEN)
    bouncer = pgbouncer_factory(mode, pool_size=8 if mode == "transaction" else 20)
    url = bouncer.url
    env = worker_env(table_name)
    if mode == "transaction":
        url += "?prepare_threshold=none"
        env["SQLA_QUEUE_TASK_LOCKS"] = "false"
    ids = insert_tasks(engine, app, 300)
    with spawned(
        "worker", RECORDING, "--url", url, "--concurrency", "2", env=env, count=2
    ) as workers:
        wait_until(lambda: "sucesso" in statuses(engine, app).values(), message="a first task")
        bouncer.admin(f"RECONNECT {bouncer.dbname}")  # every server connection is replaced
        ids += insert_tasks(engine, app, 300)
        wait_until(
            lambda: set(statuses(engine, app).values()) == {"sucesso"},
            timeout=60,
            message="every task",
        )
        stop_gracefully(workers)
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == ids


@postgresql
def test_routine_lock_behind_transaction_pooling_is_exclusive_and_freed(
    engine: Engine, app: App, pgbouncer_factory: Callable[..., PgBouncer]
) -> None:
    """With per-task locks off (the PgBouncer set-up), routine locks are
    advisory locks of an open transaction: a session lock would stay on
    whichever server session took it, and never be freed."""
    from sqla_queue.adapters.locks import TransactionRoutineLock
    from sqla_queue.settings import Settings
    from sqla_queue.worker import Runner

    bouncer = pgbouncer_factory("transaction", pool_size=4)
    pooled = bouncer.engine()
    env = Settings.from_env({"SQLA_QUEUE_TASK_LOCKS": "false"})
    first, second = (
        Runner(app.RecordingWorker(), engine=pooled, settings=env).app.routine_lock() for _ in "ab"
    )
    try:
        assert isinstance(first, TransactionRoutineLock)
        for _ in range(3):  # taken, refused to the other, freed: again and again
            assert first.try_acquire("purge")
            assert not second.try_acquire("purge")
            first.release("purge")
            assert second.try_acquire("purge")
            assert not first.try_acquire("purge")
            second.release("purge")
    finally:
        first.close()
        second.close()
        pooled.dispose()
