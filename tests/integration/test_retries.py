"""Backoff policies, errors not worth retrying, requeue from the dead
letter, time limits and item_delay, on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import random
import sqlite3
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, false, insert, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient
from sqla_queue.client.requeue import REQUEUE_CHUNK
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.policies.retry import ExponentialBackoff
from tests.acceptance.test_concurrency import spawned, stop_gracefully, worker_env
from tests.conftest import run_cli, wait_until
from tests.integration.test_worker import drain, effects, enqueue, tasks
from tests.support.app import App

UTC = dt.timezone.utc


# ------------------------------------------------------------------ backoff
def test_exponential_delays_follow_peqs_formula_within_the_jitter() -> None:
    policy = ExponentialBackoff(max_attempts=7, rng=random.Random(7))
    failed = dt.datetime(2030, 1, 1, tzinfo=UTC)
    for attempt in range(1, 7):
        delay = (policy.next_attempt_at(attempt, failed) - failed).total_seconds()  # type: ignore[operator]
        base = 10 * 2**attempt
        assert base + 11 <= delay <= base + 99, (attempt, delay)
    assert policy.next_attempt_at(7, failed) is None
    # a huge attempt number stops at thirty days instead of overflowing
    huge = ExponentialBackoff(max_attempts=1_000_000, jitter_min_seconds=0, jitter_max_seconds=0)
    assert huge.next_attempt_at(999_999, failed) == failed + dt.timedelta(days=30)


def test_exponential_worker_schedules_its_retries_by_the_formula(
    engine: Engine, app: App, installed: None
) -> None:
    class Exponential(app.RecordingWorker):  # type: ignore[name-defined,misc]
        backoff_policy = "exponential"
        max_retry = 3

    [task_id] = enqueue(engine, app, {"fail": "always"})
    for attempt in (1, 2):
        started = utcnow()
        drain(Exponential, engine)
        finished = utcnow()
        failed, retry = tasks(engine, app)[-2:]
        assert (failed.attempt, failed.status, retry.status) == (attempt, "falha", "agendada")
        base = 10 * 2**attempt
        assert started + dt.timedelta(seconds=base + 11) <= retry.run_at
        assert retry.run_at <= finished + dt.timedelta(seconds=base + 99)
        assert failed.next_attempt_at == retry.run_at
        with engine.begin() as conn:  # time passes: the retry is due
            conn.execute(update(app.Task).where(app.Task.id == retry.id).values(run_at=started))
    drain(Exponential, engine)
    chain = tasks(engine, app)
    assert [(t.attempt, t.dead, t.status) for t in chain] == [
        (1, False, "falha"),
        (2, False, "falha"),
        (3, False, "falha"),
        (1, True, "sucesso"),
    ]
    assert chain[-1].live_id == task_id


def test_an_exception_not_worth_retrying_goes_straight_to_the_dead_letter(
    engine: Engine, app: App, installed: None
) -> None:
    class Strict(app.RecordingWorker):  # type: ignore[name-defined,misc]
        no_retry = (RuntimeError,)

    [task_id] = enqueue(engine, app, {"fail": "bad input"})
    drain(Strict, engine)
    failed, dead = tasks(engine, app)
    assert (failed.status, failed.retries_exhausted, failed.message) == (
        "falha",
        True,
        "RuntimeError: asked to fail: bad input. Falha sem nova tentativa: "
        "enviada à fila de mortos.",
    )
    assert (dead.dead, dead.live_id, dead.status) == (True, task_id, "sucesso")


# ------------------------------------------------------------------ requeue
def _dead_task(engine: Engine, app: App) -> int:
    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    [task_id] = enqueue(engine, app, {"fail": "until requeued", "n": 1})
    drain(Once, engine)
    return task_id


def test_requeue_revives_a_dead_task_once_with_its_payload(
    engine: Engine, app: App, installed: None
) -> None:
    task_id = _dead_task(engine, app)
    [_, head] = tasks(engine, app)
    with Session(engine) as session, session.begin():
        preview = QueueClient(session, app.Task).requeue_dead([task_id], dry_run=True)
    assert [(r.dead_id, r.live_id, r.new_id) for r in preview] == [(head.id, task_id, None)]
    assert len(tasks(engine, app)) == 2
    with Session(engine) as session, session.begin():
        [done] = QueueClient(session, app.Task).requeue_dead([head.id])
    with Session(engine) as session, session.begin():
        assert QueueClient(session, app.Task).requeue_dead([task_id]) == []  # once only
        assert QueueClient(session, app.Task).requeue_dead(all_dead=True) == []
    new = tasks(engine, app)[-1]
    assert done.new_id == new.id
    assert (new.status, new.attempt, new.dead, new.initial_id) == ("pendente", 1, False, None)
    assert (new.previous_id, new.live_id, new.payload) == (
        head.id,
        task_id,
        {"fail": "until requeued", "n": 1},
    )

    class Healed(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            return super().execute({"n": payload["n"]}, task, session)

    drain(Healed, engine)
    assert tasks(engine, app)[-1].status == "sucesso"
    assert [note for _, chain, note in effects(engine, app) if chain == new.id] == ["{'n': 1}"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the API test runs on all three
def test_requeue_command_selects_by_process_and_time(
    engine: Engine, app: App, installed: None, db_url: str, table_name: str
) -> None:
    task_id = _dead_task(engine, app)
    env = {"SQLA_QUEUE_TEST_TABLE": table_name}
    worker = ("requeue", "tests.support.app:RecordingWorker", "--url", db_url)
    none = run_cli(*worker, "--process", "other", env=env)
    assert none.stdout.splitlines() == ["requeued 0 dead task(s)"]
    since = (utcnow() - dt.timedelta(hours=1)).isoformat()
    until = (utcnow() + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    dry = run_cli(
        *worker, "--process", "faturar", "--since", since, "--until", until, "--dry-run", env=env
    ).stdout.splitlines()
    assert dry[-1] == "would requeue 1 dead task(s)"
    assert f"(task {task_id}, faturar) (dry run)" in dry[0]
    out = run_cli(*worker, "--all", env=env).stdout.splitlines()
    assert out[-1] == "requeued 1 dead task(s)" and "-> new task" in out[0]
    assert run_cli(*worker, "--all", env=env).stdout.splitlines() == ["requeued 0 dead task(s)"]
    bad = run_cli(*worker, env=env, check=False)
    assert bad.returncode == 2 and "select dead tasks with --id" in bad.stderr
    assert "Traceback" not in bad.stderr


RACERS = 4
RACE_ROUNDS = 12


def _dead_heads(engine: Engine, app: App, count: int) -> list[int]:
    """``count`` dead tasks, as the worker leaves them: a failed first
    attempt and its finished dead-letter run (the head); the heads' ids."""
    table = app.Task.__table__
    heads = []
    with engine.begin() as conn:
        for n in range(count):
            task_id = conn.execute(
                insert(table).values(
                    processo="faturar", payload=f'{{"n": {n}}}', status="falha", tentativa=1
                )
            ).inserted_primary_key[0]
            head = conn.execute(
                insert(table).values(
                    processo="faturar", status="sucesso", dead=True, live_id=task_id
                )
            ).inserted_primary_key[0]
            heads.append(head)
    return heads


def _requeue_at_the_barrier(
    url: str, table: str, heads: list[int], barrier: Any, results: Any
) -> None:
    """One racing process: for each head, wait at the barrier, then
    requeue_dead it in a transaction of the application's plain engine."""
    from sqla_queue.common.redaction import describe_error
    from tests.support.app import build

    engine = create_engine(url)
    try:
        model = build(table).Task
        revived: list[int] = []
        for head in heads:
            barrier.wait(timeout=120)
            with engine.begin() as conn:
                done = QueueClient(conn, model).requeue_dead([head])
            revived += [requeued.dead_id for requeued in done]
        results.put(("revived", revived))
    except BaseException as exc:
        barrier.abort()
        results.put(("error", describe_error(exc)))
    finally:
        engine.dispose()


def test_requeues_racing_in_several_processes_revive_a_dead_task_once(
    engine: Engine, app: App, db_url: str, table_name: str
) -> None:
    """Several processes call requeue_dead on the same dead task at the same
    moment, through a plain create_engine() engine (on SQLite: Python's
    sqlite3 opens no transaction for a SELECT, and FOR UPDATE does nothing),
    round after round: each dead task is revived exactly once."""
    heads = _dead_heads(engine, app, RACE_ROUNDS)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS)
    results = context.Queue()
    racers = [
        context.Process(
            target=_requeue_at_the_barrier, args=(db_url, table_name, heads, barrier, results)
        )
        for _ in range(RACERS)
    ]
    for racer in racers:
        racer.start()
    try:
        outcomes = [results.get(timeout=300) for _ in racers]
    finally:
        for racer in racers:
            racer.join(timeout=30)
            if racer.is_alive():
                racer.kill()
    assert [kind for kind, _ in outcomes] == ["revived"] * RACERS, outcomes
    reported = Counter(head for _, revived in outcomes for head in revived)
    assert reported == Counter(heads)  # one process each time says it revived the task
    c = app.Task.__table__.c
    with engine.connect() as conn:
        rows = conn.execute(
            select(c.id_anterior).where(c.id_anterior.in_(heads), c.dead == false())
        ).scalars()
        assert Counter(rows) == Counter(heads)  # and one new chain each


# ------------------------------------------------------------------ time limits
def test_a_handler_past_its_time_limit_is_abandoned_and_the_lane_carries_on(
    engine: Engine, app: App, installed: None
) -> None:
    class Limited(app.RecordingWorker):  # type: ignore[name-defined,misc]
        time_limit_seconds = 0.5
        max_retry = 1

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            super().execute(payload, task, session)
            session.flush()  # its write is in the transaction, to be rolled back
            if payload.get("spin"):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # pure Python: interrupted
                    pass
            if payload.get("sleep"):
                time.sleep(5)  # in C: the thread and its connection are abandoned
            return None

    spin, quick, sleep, last = enqueue(
        engine, app, {"spin": True}, {"n": 2}, {"sleep": True}, {"n": 4}
    )
    started = time.monotonic()
    drain(Limited, engine)
    assert time.monotonic() - started < 20
    by_id = {t.id: t for t in tasks(engine, app)}
    for task_id in (spin, sleep):
        assert by_id[task_id].status == "falha"
        assert by_id[task_id].message.startswith(
            "TimeLimitExceeded: the handler ran past its time limit of 0.5 s and was abandoned"
        )
    assert (by_id[quick].status, by_id[last].status) == ("sucesso", "sucesso")
    notes = [note for task_id, _, note in effects(engine, app) if task_id in (spin, sleep)]
    assert notes == []  # their writes rolled back
    assert sorted(t for t, _, _ in effects(engine, app) if t in (quick, last)) == [quick, last]


@pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
def test_a_statement_past_the_time_limit_is_cancelled(
    engine: Engine, app: App, installed: None
) -> None:
    class SlowQuery(app.RecordingWorker):  # type: ignore[name-defined,misc]
        time_limit_seconds = 0.5
        max_retry = 1

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            sleep = "pg_sleep(30)" if engine.dialect.name == "postgresql" else "SLEEP(30)"
            session.execute(text(f"SELECT {sleep}"))
            return None

    [task_id] = enqueue(engine, app, {"n": 1})
    started = time.monotonic()
    drain(SlowQuery, engine)
    assert time.monotonic() - started < 15
    failed = tasks(engine, app)[0]
    assert (failed.id, failed.status) == (task_id, "falha")
    assert failed.message.startswith("TimeLimitExceeded:")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
def test_a_long_sqlite_statement_past_the_time_limit_is_interrupted_and_its_failure_recorded(
    engine: Engine, app: App, installed: None, table_name: str, db_url: str, write: bool
) -> None:
    """A real worker whose handler is stuck in an hours-long SQLite statement
    (a read; or a write, whose interruption rolls back SQLite's whole
    transaction) under a 1 s time limit: the statement is interrupted, the
    attempt's failure is recorded, and the database file is free for other
    writers; it once stayed write-locked while the statement ran, the task
    stuck 'processando'."""
    [task_id] = enqueue(engine, app, {"write": write})
    env = worker_env(table_name)
    with spawned("worker", "tests.support.app:LongStatementWorker", "--url", db_url, env=env) as [
        worker
    ]:

        def waited(predicate: Any, what: str) -> None:
            try:
                wait_until(predicate, 90, message=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the worker said:\n{worker.output}") from None

        def attempt() -> Any:
            return next(t for t in tasks(engine, app) if t.id == task_id)

        waited(lambda: attempt().status == "falha", "the failure")
        # another writer, on a connection of its own (Python's sqlite3 waits up to 10 s)
        database = engine.url.database
        assert database is not None
        with contextlib.closing(sqlite3.connect(database, timeout=10)) as other, other:
            other.execute(
                f"INSERT INTO {app.Effect.__tablename__} (task_id, chain_id, note) "
                "VALUES (0, 0, 'another writer')"
            )
        waited(
            lambda: [t.status for t in tasks(engine, app)] == ["falha", "sucesso"],
            "the dead-letter run",
        )
        stop_gracefully([worker])
    assert attempt().message == (
        "TimeLimitExceeded: the handler ran past its time limit of 1 s and was abandoned. "
        "Máximo de tentativas atingido."
    )
    notes = sorted(note or "" for _, _, note in effects(engine, app))
    assert notes == ["another writer", "dead"]  # the handler's own write rolled back


# ------------------------------------------------------------------ item_delay
def test_item_delay_holds_a_new_task_back(engine: Engine, app: App, installed: None) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    delayed = Settings.from_env({"SQLA_QUEUE_ITEM_DELAY": "3600"})
    assert app.RecordingWorker().run(engine=engine, burst=True, settings=delayed) == 0
    assert tasks(engine, app)[0].status == "pendente"
    with engine.begin() as conn:  # an hour has passed
        conn.execute(update(app.Task).values(run_at=utcnow() - dt.timedelta(hours=1, seconds=1)))
    assert app.RecordingWorker().run(engine=engine, burst=True, settings=delayed) == 0
    assert [(t.id, t.status) for t in tasks(engine, app)] == [(task_id, "sucesso")]


# ------------------------------------------------------------------ per task
def test_per_task_leases_and_time_limits(engine: Engine, app: App, installed: None) -> None:
    """``lease_seconds_for`` and ``time_limit_for`` give some tasks their own;
    a value out of range falls back to the worker's, with a warning."""
    from sqla_queue.worker import Runner

    class PerTask(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

        def lease_seconds_for(self, task: Any) -> float:
            return {"long": 600.0, "bad": -1.0}.get(task.process, self._lease_seconds)

        def time_limit_for(self, task: Any) -> float | None:
            return 0.3 if task.process == "slow" else None

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            if task.process == "slow":
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    pass
            return super().execute(payload, task, session)

    long, bad, plain = (
        enqueue(engine, app, {"n": n}, process=p)[0] for n, p in enumerate(("long", "bad", "x"))
    )
    worker = Runner.for_worker(PerTask(), engine=engine, settings=Settings())
    with worker.adapter.connect_claim(engine) as claim:
        before = utcnow()
        claimed = worker.manager.claim(claim, limit=3)
        assert len(claimed) == 3
        # the per-task locks are session-level: a connection back in the pool
        # with them would keep the run below from claiming these tasks
        with claim.begin():
            worker.adapter.lock_release_many(claim, ids=[t.id for t in claimed])
    leases = {t.id: (t.lease_expires_at - before).total_seconds() for t in tasks(engine, app)}
    assert 590 < leases[long] <= 601
    assert 20 < leases[bad] <= 31 and 20 < leases[plain] <= 31
    assert worker.app.claims.by_lease(30.0) == {600.0: [long], 30.0: [bad, plain]}
    with engine.begin() as conn:  # back to pendente, for the run below
        conn.execute(update(app.Task).values(status="pendente", worker_id=None))
    [slow] = enqueue(engine, app, {"n": 9}, process="slow")
    drain(PerTask, engine)
    status = {t.id: (t.status, t.message or "") for t in tasks(engine, app)}
    assert status[slow][0] == "falha" and status[slow][1].startswith("TimeLimitExceeded")
    assert {status[i][0] for i in (long, bad, plain)} == {"sucesso"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # no dialect in the chunking
def test_a_requeue_of_many_reports_its_progress_chunk_by_chunk(
    engine: Engine, app: App, installed: None
) -> None:
    heads = _dead_heads(engine, app, REQUEUE_CHUNK + 250)
    reports: list[tuple[int, int | None, str]] = []
    with Session(engine) as session, session.begin():
        done = QueueClient(session, app.Task).requeue_dead(
            all_dead=True, progress=lambda *report: reports.append(report)
        )
    assert sorted(item.dead_id for item in done) == heads
    assert all(item.new_id is not None for item in done)
    total = len(heads)
    assert reports == [
        (REQUEUE_CHUNK, total, f"requeued {REQUEUE_CHUNK}"),
        (total, total, f"requeued {total}"),
    ]
