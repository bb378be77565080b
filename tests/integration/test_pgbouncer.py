"""Workers behind a real PgBouncer (Debian's 1.18), in session and transaction pooling.

Transaction pooling hands each transaction (each autocommit statement) to
any server connection: session-level advisory locks land on whatever server
session the pooler picked, so a rescue that *tries* a task's lock succeeds
re-entrantly on the very session that holds a live task's lock. The rescue
reads pg_locks instead, and trusts the lease; see docs/pgbouncer.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, select

from sqla_queue.adapters import adapter_for
from sqla_queue.adapters.locks import LeaseRoutineLock
from sqla_queue.schema.configuration_table import configuration_table_for
from tests.acceptance.test_concurrency import (
    Spawned,
    effects,
    insert_tasks,
    spawned,
    statuses,
    stop_gracefully,
    worker_env,
)
from tests.conftest import ROOT, wait_until
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
    leases in the configuration table: a session lock would stay on
    whichever server session took it, and never be freed."""
    from sqla_queue.config.settings import Settings
    from sqla_queue.worker import Runner

    bouncer = pgbouncer_factory("transaction", pool_size=4)
    pooled = bouncer.engine()
    env = Settings.from_env({"SQLA_QUEUE_TASK_LOCKS": "false"})
    first, second = (
        Runner.for_worker(app.RecordingWorker(), engine=pooled, settings=env).app.routine_lock()
        for _ in "ab"
    )
    try:
        assert isinstance(first, LeaseRoutineLock)
        for _ in range(3):  # taken, refused to the other, freed: again and again
            assert first.try_acquire("purge")
            assert not second.try_acquire("purge")
            first.release("purge")
            assert second.try_acquire("purge")
            assert not first.try_acquire("purge")
            second.release("purge")
        # a worker starting reads its settings from the table the leases are in
        Runner.for_worker(app.RecordingWorker(), engine=pooled, settings=env)
    finally:
        first.close()
        second.close()
        pooled.dispose()
        _drop_leases(engine, app)


def _drop_leases(engine: Engine, app: App) -> None:
    """The test's configuration table, where the leases were."""
    configuration_table_for(app.Task.__table__).drop(engine, checkfirst=True)


def _lease_lock(pooled: Engine, app: App, owner: str) -> LeaseRoutineLock:
    """A worker's routine lock behind transaction pooling, with the
    shortest dead-peer bound (2 s): its lease's bound."""
    adapter = adapter_for(
        pooled.dialect, app.Task.__table__, "unused", task_locks=False, dead_peer_seconds=2.0
    )
    lock = adapter.routine_lock(pooled)
    assert isinstance(lock, LeaseRoutineLock)
    lock.owner = owner
    return lock


def _in_threads(work: Callable[[LeaseRoutineLock], None], locks: list[LeaseRoutineLock]) -> None:
    """``work(lock)`` for each lock at once, a thread each, all finished."""
    threads = [threading.Thread(target=work, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)


def _lease_row(engine: Engine, app: App, name: str) -> dict[str, Any]:
    settings = configuration_table_for(app.Task.__table__)
    c = settings.c
    with engine.connect() as conn:
        value = conn.execute(
            select(c.value).where(
                c.setting_name == f"routine_lock:{name}", c.queue_name == app.Task.__table__.name
            )
        ).scalar_one()
    lease: dict[str, Any] = json.loads(value)
    return lease


@postgresql
def test_a_held_routine_lease_pins_no_server_connection_and_has_one_holder_at_a_time(
    engine: Engine, app: App, pgbouncer_factory: Callable[..., PgBouncer]
) -> None:
    """A pool of one server connection: while a lease is held, another
    client's query runs at once (an open transaction would make it wait out
    query_wait_timeout). Three holders in three threads take and give back
    one lease as fast as they can: never two of them hold it at once."""
    bouncer = pgbouncer_factory("transaction", pool_size=1, query_wait_timeout=2)
    pooled = bouncer.engine()
    locks = [_lease_lock(pooled, app, f"worker-{n}") for n in range(3)]
    holding: list[str] = []
    overlaps: list[list[str]] = []
    taken = Counter[str]()
    mutex = threading.Lock()

    def contend(lock: LeaseRoutineLock) -> None:
        for _ in range(30):
            if not lock.try_acquire("purge"):
                continue
            with mutex:
                holding.append(lock.owner or "")
                if len(holding) > 1:
                    overlaps.append(list(holding))
                taken[lock.owner or ""] += 1
            with pooled.connect() as conn:  # the holder's routine, on a connection of its own
                conn.execute(select(1))
            with mutex:
                holding.remove(lock.owner or "")
            lock.release("purge")

    client = bouncer.connect()
    try:
        assert locks[0].try_acquire("purge")
        assert not locks[1].try_acquire("purge")
        assert client.execute("SELECT 1").fetchone() == (1,)
        held = _lease_row(engine, app, "purge")
        assert (held["holder"], held["lease"]) == ("worker-0", locks[0].token)
        locks[0].release("purge")
        assert _lease_row(engine, app, "purge")["lease"] is None
        _in_threads(contend, locks)
    finally:
        client.close()
        for lock in locks:
            lock.close()
        pooled.dispose()
        _drop_leases(engine, app)
    assert overlaps == []
    assert len(taken) >= 2, taken  # the lease changed hands between holders


#: a holder in a process of its own, killed while it holds the lease
_DOOMED_HOLDER = """
import sys
from sqlalchemy import create_engine
from sqla_queue.adapters import adapter_for
from tests.support.app import build

app = build(sys.argv[1])
engine = create_engine(sys.argv[2], connect_args={"prepare_threshold": None})
adapter = adapter_for(
    engine.dialect, app.Task.__table__, "unused", task_locks=False, dead_peer_seconds=2.0
)
lock = adapter.routine_lock(engine)
lock.owner = "doomed"
print("held" if lock.try_acquire("purge") else "refused", flush=True)
sys.stdin.read()
"""


@postgresql
def test_a_dead_holder_s_routine_lease_is_taken_over_once_expired_by_one_worker(
    engine: Engine, app: App, table_name: str, pgbouncer_factory: Callable[..., PgBouncer]
) -> None:
    """A holder killed without giving its lease back (2 s bound): while it
    lived, renewing, nobody else took it; once expired by the database's
    clock, exactly one of two workers racing for it takes it, and keeps it."""
    bouncer = pgbouncer_factory("transaction", pool_size=4)
    pooled = bouncer.engine()
    racers = [_lease_lock(pooled, app, f"racer-{n}") for n in range(2)]
    doomed = Spawned(
        subprocess.Popen(
            [sys.executable, "-c", _DOOMED_HOLDER, table_name, bouncer.url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    won = threading.Event()
    results: dict[str, list[bool]] = {lock.owner or "": [] for lock in racers}
    taken_at: dict[str, dict[str, Any]] = {}

    def race(lock: LeaseRoutineLock) -> None:
        deadline = time.monotonic() + 30
        tries_after_win = 0
        while time.monotonic() < deadline and tries_after_win < 20:
            got = lock.try_acquire("purge")
            results[lock.owner or ""].append(got)
            if got and not won.is_set():
                taken_at[lock.owner or ""] = _lease_row(engine, app, "purge")
                won.set()
            if won.is_set():
                tries_after_win += 1

    try:
        wait_until(
            lambda: (
                {"held", "refused"} & set(doomed.output.split()) or doomed.proc.poll() is not None
            ),
            message="the doomed holder's lease",
        )
        assert "held" in doomed.output.split(), doomed.output
        for _ in range(3):  # alive, it renews its lease
            assert not any(lock.try_acquire("purge") for lock in racers)
        assert _lease_row(engine, app, "purge")["holder"] == "doomed"
        doomed.kill()
        expired_at = _lease_row(engine, app, "purge")["until"]
        _in_threads(race, racers)
    finally:
        doomed.kill()
        for lock in racers:
            lock.close()
        pooled.dispose()
        _drop_leases(engine, app)
    winners = [owner for owner, tries in results.items() if any(tries)]
    assert len(winners) == 1, results
    [winner] = winners
    assert list(taken_at) == [winner]
    # taken once expired by the database's clock: its lease began at or after
    assert taken_at[winner]["until"] - 2.0 >= expired_at
    loser = next(owner for owner in results if owner != winner)
    assert len(results[loser]) >= 20  # it kept trying while the winner held it


#: what a client of the pool must never see changed by a worker
_WATCHED = (
    "enable_seqscan",
    "jit",
    "plan_cache_mode",
    "idle_session_timeout",
    "idle_in_transaction_session_timeout",
    "tcp_keepalives_idle",
    "tcp_user_timeout",
    "application_name",
)


def _settings(conn: Any) -> tuple[str, ...]:
    row = conn.execute(
        "SELECT " + ", ".join(f"current_setting('{name}')" for name in _WATCHED)
    ).fetchone()
    return tuple(row)


@postgresql
def test_a_worker_with_default_settings_changes_no_setting_of_the_pool_s_other_clients(
    engine: Engine,
    app: App,
    table_name: str,
    pgbouncer_factory: Callable[..., PgBouncer],
) -> None:
    """Transaction pooling, the worker started with the defaults (task locks
    on, as a user who has not read docs/pgbouncer.md would): it tells that
    it goes through a pooler, makes no session setting there, and another
    client of the same two server connections sees the server's settings
    throughout."""
    bouncer = pgbouncer_factory("transaction", pool_size=2)
    ids = insert_tasks(engine, app, 200)
    client = psycopg.connect(
        bouncer.url.replace("postgresql+psycopg://", "postgresql://"),
        autocommit=True,
        prepare_threshold=None,
        application_name="",
    )
    try:
        expected = _settings(client)
        seen: set[tuple[str, ...]] = set()
        with spawned(
            "worker",
            RECORDING,
            "--url",
            bouncer.url + "?prepare_threshold=none",
            "--concurrency",
            "2",
            env=worker_env(table_name),
        ) as [worker]:

            def done() -> bool:
                seen.add(_settings(client))
                return set(statuses(engine, app).values()) == {"sucesso"}

            wait_until(done, timeout=60, message="every task, the client watching")
            for _ in range(20):  # and while the worker is idle
                seen.add(_settings(client))
            stop_gracefully([worker])
        assert seen == {expected}
        assert "through a pooler or proxy" in worker.output
    finally:
        client.close()
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == ids


@postgresql
def test_routine_locks_pin_no_server_connection_between_runs(
    engine: Engine,
    app: App,
    table_name: str,
    pgbouncer_factory: Callable[..., PgBouncer],
) -> None:
    """The documented set-up (task locks off) on a pool of two server
    connections that makes a client wait at most 2 s: a worker's routines
    (taking their locks every second) and its two lanes leave room for
    another client, whose 30 queries never wait out the pool."""
    bouncer = pgbouncer_factory("transaction", pool_size=2, query_wait_timeout=2)
    env = worker_env(
        table_name,
        SQLA_QUEUE_TASK_LOCKS="false",
        SQLA_QUEUE_RESCUE_CRON="@every 1s",
        SQLA_QUEUE_SCHEDULE_CRON="@every 1s",
        SQLA_QUEUE_PURGE_CRON="@every 1s",
        SQLA_QUEUE_TTL_CRON="@every 1s",
        SQLA_QUEUE_VACUUM_CRON="@every 1s",
    )
    url = bouncer.url + "?prepare_threshold=none"
    with spawned("worker", RECORDING, "--url", url, "--concurrency", "2", env=env) as [worker]:
        ids = insert_tasks(engine, app, 20)
        wait_until(
            lambda: set(statuses(engine, app).values()) == {"sucesso"},
            timeout=60,
            message="every task",
        )
        client = psycopg.connect(
            bouncer.url.replace("postgresql+psycopg://", "postgresql://"),
            autocommit=True,
            prepare_threshold=None,
        )
        try:
            for _ in range(30):  # about 3 s of routine slots
                assert client.execute("SELECT pg_sleep(0.1), 1").fetchone() == ("", 1)
        finally:
            client.close()
        stop_gracefully([worker])
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == ids
