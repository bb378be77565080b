"""The worker in-process: outcomes, the seed's retry chain, dead letters, order.

Every test runs on SQLite, PostgreSQL and MariaDB (the ``engine`` fixture)
unless it says otherwise. ``drain()`` runs a burst worker, which returns 0
once no task is ready; worker subclasses are defined inside each test so that
what a handler saw stays local to that test.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, WorkerBase
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.worker import QueueApp, Runner
from tests.conftest import lock_waits, wait_until
from tests.support.app import App

SUCCESS = "Concluído com sucesso"
FAILURE = "ValueError: handler failed on purpose"
RETRY_SUFFIX = ". Tarefa reenfileirada."
EXHAUSTED_SUFFIX = ". Máximo de tentativas atingido."
RESCUED = (
    "Falha desconhecida de processamento (processamento abortado repentinamente). "
    "Tarefa reenfileirada."
)


# --------------------------------------------------------------------- helpers
def drain(worker: type[WorkerBase], engine: Engine, **options: Any) -> None:
    """Run ``worker`` in burst mode until no task is ready."""
    assert worker().run(engine=engine, burst=True, settings=Settings(), **options) == 0


def enqueue(engine: Engine, app: App, *payloads: Any, **columns: Any) -> list[int]:
    """Enqueue one task per payload through the ORM (the flush hook); their ids."""
    columns.setdefault("process", "faturar")
    with Session(engine) as session, session.begin():
        tasks = [app.Task(payload=payload, **columns) for payload in payloads]
        session.add_all(tasks)
        session.flush()
        return [task.id for task in tasks]


def tasks(engine: Engine, app: App) -> list[Any]:
    with Session(engine) as session:
        return list(session.scalars(select(app.Task).order_by(app.Task.id)))


def effects(engine: Engine, app: App) -> list[tuple[int, int, str | None]]:
    """(task_id, chain_id, note) of every committed Effect, in insertion order."""
    effect = app.Effect
    with engine.connect() as conn:
        rows = conn.execute(
            select(effect.task_id, effect.chain_id, effect.note).order_by(effect.id)
        )
        return [(task_id, chain_id, note) for task_id, chain_id, note in rows]


# --------------------------------------------------------------------- success
def test_success_commits_the_handler_effect_together_with_sucesso(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    seen_while_running: list[tuple[str, int]] = []

    class Worker(app.RecordingWorker):
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            super().execute(payload, task, session)
            session.flush()
            with observer.connect() as conn:
                status = conn.execute(
                    select(app.Task.status).where(app.Task.id == task.id)
                ).scalar_one()
                committed = conn.execute(
                    select(func.count())
                    .select_from(app.Effect)
                    .where(app.Effect.task_id == task.id)
                ).scalar_one()
            seen_while_running.append((status, committed))
            return payload.get("message")

    custom, default = enqueue(engine, app, {"message": "faturado"}, {"n": 2})
    drain(Worker, engine)

    assert seen_while_running == [("processando", 0), ("processando", 0)]
    assert [(t.id, t.status, t.message) for t in tasks(engine, app)] == [
        (custom, "sucesso", "faturado"),
        (default, "sucesso", SUCCESS),
    ]
    assert effects(engine, app) == [
        (custom, custom, "{'message': 'faturado'}"),
        (default, default, "{'n': 2}"),
    ]


def test_every_attempt_records_when_it_was_claimed_and_when_it_ended(
    engine: Engine, app: App, installed: None
) -> None:
    class Worker(app.RecordingWorker):
        max_retry = 2

    enqueue(engine, app, {"n": 1}, {"fail": "always"})
    drain(Worker, engine)

    rows = tasks(engine, app)
    # the success, two failed attempts, the dead-letter run
    assert [(t.status, t.dead) for t in rows] == [
        ("sucesso", False),
        ("falha", False),
        ("falha", False),
        ("sucesso", True),
    ]
    for task in rows:
        assert task.started_at is not None and task.finished_at is not None
        # started_at and finished_at are the database's clock; the run time
        # (claim to end) is never negative
        assert task.started_at <= task.finished_at
    retry = rows[2]
    assert retry.started_at >= rows[1].finished_at


def test_message_longer_than_the_column_is_cut_and_the_task_still_succeeds(
    engine: Engine, app: App, installed: None
) -> None:
    class Worker(app.RecordingWorker):
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            super().execute(payload, task, session)
            return "x" * 600

    [task_id] = enqueue(engine, app, {"n": 1})
    drain(Worker, engine)

    [task] = tasks(engine, app)
    assert (task.status, task.retries_exhausted, task.requeued) == ("sucesso", False, False)
    assert task.message == "x" * 499 + "…"
    assert effects(engine, app) == [(task_id, task_id, "{'n': 1}")]


def _guarded_worker(app: App, guard: Table) -> type[WorkerBase]:
    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            super().execute(payload, task, session)
            if payload.get("bad"):  # passes the flush, fails the deferred check at COMMIT
                session.execute(insert(guard), [{"k": 1}, {"k": 1}])
            return "looked fine"

    return Worker


@pytest.fixture
def guard(engine: Engine, table_name: str) -> Iterator[Table]:
    """A table with a deferred unique constraint: it fails at COMMIT, after
    every handler of the batch has returned (PostgreSQL only: MariaDB has no
    deferred constraints, SQLite none without foreign keys)."""
    table = Table(
        f"{table_name}_guard",
        MetaData(),
        Column("k", Integer),
        UniqueConstraint("k", deferrable=True, initially="DEFERRED"),
    )
    table.create(engine)
    try:
        yield table
    finally:
        table.drop(engine)


def _guard_rows(engine: Engine, guard: Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(guard)).scalar_one())


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_batch_failing_at_commit_finds_the_task_at_fault(
    engine: Engine, app: App, installed: None, guard: Table
) -> None:
    """The whole batch rolls back; each task then runs alone: the good one
    commits once, the one whose commit fails again gets the failure."""
    bad, good = enqueue(engine, app, {"n": 1, "bad": True}, {"n": 2})
    worker = _guarded_worker(app, guard)()
    runner = Runner.for_worker(worker, engine=engine, settings=Settings())
    manager, adapter = runner.manager, runner.adapter
    with adapter.connect_claim(engine) as claim_conn, engine.connect() as work_conn:
        claimed = manager.claim(claim_conn, limit=2)
        assert [t.id for t in claimed] == [bad, good]
        result = manager.run_batch(claim_conn, work_conn, claimed, worker.dispatch)
    assert (result.succeeded, result.failed, result.handed_back) == (1, 1, [])

    first_bad, first_good, retry = tasks(engine, app)
    assert (first_good.id, first_good.status, first_good.message) == (
        good,
        "sucesso",
        "looked fine",
    )
    assert (first_bad.id, first_bad.status, first_bad.requeued) == (bad, "falha", True)
    assert first_bad.message.startswith("UniqueViolation: duplicate key value")
    assert first_bad.message.endswith(RETRY_SUFFIX)
    assert "INSERT INTO" not in first_bad.message  # the driver's error, not the SQL
    assert (retry.initial_id, retry.attempt, retry.status) == (bad, 2, "pendente")
    assert effects(engine, app) == [(good, good, "{'n': 2}")]
    assert _guard_rows(engine, guard) == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_task_failing_at_commit_retries_then_runs_dead(
    engine: Engine, app: App, installed: None, guard: Table
) -> None:
    [task_id] = enqueue(engine, app, {"n": 1, "bad": True})
    drain(_guarded_worker(app, guard), engine)

    first, retry, dead = tasks(engine, app)
    assert (first.id, first.status, first.requeued) == (task_id, "falha", True)
    assert (retry.initial_id, retry.attempt, retry.status, retry.retries_exhausted) == (
        task_id,
        2,
        "falha",
        True,
    )
    assert (dead.dead, dead.live_id, dead.status, dead.message) == (
        True,
        task_id,
        "sucesso",
        "dead handled",
    )
    assert effects(engine, app) == [(dead.id, dead.id, "dead")]
    assert _guard_rows(engine, guard) == 0


def test_failed_attempts_roll_back_their_writes_and_chain_retries_into_a_dead_letter(
    engine: Engine, app: App, installed: None
) -> None:
    received: list[tuple[int, Any, Any]] = []

    class Worker(app.FailingWorker):
        """FailingWorker (max_retry 3); execute_dead is RecordingWorker's."""

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            received.append((task.id, task.attempt, payload))
            return super().execute(payload, task, session)

        def execute_dead(self, payload: Any, task: Any, session: Session) -> str | None:
            received.append((task.id, "dead", payload))
            return app.RecordingWorker.execute_dead(self, payload, task, session)

    payload = {"invoice": 7, "texto": "ação"}
    [first_id] = enqueue(
        engine, app, payload, origin="erp", destination="sefaz", external_key="nf-7", priority=80
    )
    drain(Worker, engine)

    a, b, c, dead = tasks(engine, app)
    assert [(t.id, t.attempt) for t in (a, b, c)] == [(first_id, 1), (b.id, 2), (c.id, 3)]
    assert received == [
        (a.id, 1, payload),
        (b.id, 2, payload),
        (c.id, 3, payload),
        (dead.id, "dead", payload),
    ]
    # every failed attempt rolled back its Effect; only the dead-letter run's commits
    assert effects(engine, app) == [(dead.id, dead.id, "dead")]

    for failed, retry in ((a, b), (b, c)):
        assert (failed.status, failed.requeued, failed.retries_exhausted) == ("falha", True, False)
        assert failed.message == FAILURE + RETRY_SUFFIX
        assert failed.next_attempt_at == retry.run_at
        assert (
            retry.initial_id,
            retry.previous_id,
            retry.previous_run_at,
            retry.previous_status,
            retry.previous_message,
        ) == (a.id, failed.id, failed.run_at, "falha", failed.message)
        assert retry.payload_text is None  # stored on the first attempt only
        assert retry.first_run_at == a.first_run_at
    assert (c.status, c.requeued, c.retries_exhausted, c.next_attempt_at) == (
        "falha",
        False,
        True,
        None,
    )
    assert c.message == FAILURE + EXHAUSTED_SUFFIX
    assert a.initial_id is None and a.payload == payload

    assert (dead.dead, dead.live_id, dead.attempt, dead.initial_id, dead.previous_id) == (
        True,
        a.id,
        1,
        None,
        None,
    )
    assert dead.payload == payload
    assert (dead.status, dead.message) == ("sucesso", "dead handled")
    for row in (a, b, c, dead):
        assert (row.origin, row.destination, row.process, row.external_key) == (
            "erp",
            "sefaz",
            "faturar",
            "nf-7",
        )
        assert row.priority == 80
        assert row.payload_hash == a.payload_hash
    assert [row.dead for row in (a, b, c)] == [False, False, False]


def test_dead_letter_run_that_exhausts_its_attempts_starts_no_other(
    engine: Engine, app: App, installed: None
) -> None:
    class Worker(app.FailingWorker):
        max_retry = 2

        def execute_dead(self, payload: Any, task: Any, session: Session) -> str | None:
            raise RuntimeError("dead handler failed too")

    [first_id] = enqueue(engine, app, {"n": 1})
    drain(Worker, engine)

    rows = tasks(engine, app)
    assert [(t.dead, t.attempt, t.status, t.retries_exhausted) for t in rows] == [
        (False, 1, "falha", False),
        (False, 2, "falha", True),
        (True, 1, "falha", False),
        (True, 2, "falha", True),
    ]
    dead_first, dead_last = rows[2], rows[3]
    assert (dead_first.live_id, dead_last.live_id, dead_last.initial_id) == (
        first_id,
        first_id,
        dead_first.id,
    )
    assert dead_last.message == "RuntimeError: dead handler failed too" + EXHAUSTED_SUFFIX
    assert effects(engine, app) == []


def test_an_error_ending_in_a_period_gets_one_period_before_the_suffix(
    engine: Engine, app: App, installed: None
) -> None:
    """nsj-queue-lib's texts are f"{e}. Tarefa reenfileirada." and f"{e}.
    Máximo de tentativas atingido.": an error that ends its sentence (a
    driver's "... (Background on this error at: ...)." does) is not followed
    by a second period."""

    class Worker(app.RecordingWorker):
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            raise RuntimeError("server closed the connection (see its log).")

    enqueue(engine, app, {"n": 1})
    drain(Worker, engine)
    first, last, _dead = tasks(engine, app)
    error = "RuntimeError: server closed the connection (see its log)."
    assert first.message == error + " Tarefa reenfileirada."
    assert last.message == error + " Máximo de tentativas atingido."


def test_a_dead_letter_run_is_logged_as_a_dead_letter_run_never_as_a_success(
    engine: Engine, app: App, installed: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Its row keeps the seed's values (sucesso, dead = true); every log line
    about it says dead-letter run, and none says it succeeded."""

    class Worker(app.FailingWorker):
        max_retry = 1

    class DeadFails(app.FailingWorker):
        max_retry = 1

        def execute_dead(self, payload: Any, task: Any, session: Session) -> str | None:
            raise RuntimeError("dead handler failed")

    enqueue(engine, app, {"n": 1})
    with caplog.at_level(logging.DEBUG, logger="sqla_queue"):
        drain(Worker, engine)
    [live, dead] = tasks(engine, app)
    assert (dead.dead, dead.status, dead.message) == (True, "sucesso", "dead handled")
    about_dead = [r.getMessage() for r in caplog.records if f"task {dead.id} (" in r.getMessage()]
    assert about_dead == [
        line for line in about_dead if line.startswith(f"dead-letter run task {dead.id} (chain ")
    ]
    assert any(" done in " in line for line in about_dead), about_dead
    assert not any("succeeded" in line for line in about_dead), about_dead
    assert any(
        r.getMessage().startswith(f"task {live.id} (chain {live.id}, attempt 1, faturar) failed")
        for r in caplog.records
    )

    caplog.clear()
    enqueue(engine, app, {"n": 2})
    with caplog.at_level(logging.DEBUG, logger="sqla_queue"):
        drain(DeadFails, engine)
    failed = tasks(engine, app)[-1]
    assert (failed.dead, failed.status) == (True, "falha")
    assert f"dead-letter run task {failed.id} (chain {failed.id}, attempt 1, faturar) failed" in (
        caplog.text
    )
    assert "dead-letter dead-letter" not in caplog.text


def test_failure_message_never_stores_or_logs_a_secret(
    engine: Engine, app: App, installed: None, caplog: pytest.LogCaptureFixture
) -> None:
    class Worker(app.RecordingWorker):
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            raise RuntimeError("connect to postgresql://u:hunter2@db failed, token=abc")

    enqueue(engine, app, {"n": 1})
    with caplog.at_level(logging.DEBUG, logger="sqla_queue"):
        drain(Worker, engine)

    first, last, dead = tasks(engine, app)
    masked = "RuntimeError: connect to postgresql://u:***@db failed, token=***"
    assert first.message == masked + RETRY_SUFFIX
    assert (last.previous_message, last.message) == (first.message, masked + EXHAUSTED_SUFFIX)
    assert dead.dead is True
    stored = " ".join(str(v) for t in (first, last, dead) for v in (t.message, t.previous_message))
    assert "hunter2" not in stored and "abc" not in stored
    assert "(chain 1, attempt 1, faturar) failed" in caplog.text
    assert "Traceback (most recent call last)" in caplog.text
    assert "hunter2" not in caplog.text and "token=abc" not in caplog.text


def test_failing_task_in_a_batch_rolls_back_only_its_own_writes(
    engine: Engine, app: App, installed: None
) -> None:
    class Worker(app.RecordingWorker):
        max_retry = 1  # a failure goes straight to its dead-letter run

    payloads = [{"fail": True, "n": n} if n % 5 == 0 else {"n": n} for n in range(30)]
    ids = enqueue(engine, app, *payloads)
    drain(Worker, engine)

    failing = {ids[n] for n in range(0, 30, 5)}
    rows = tasks(engine, app)
    by_id = {t.id: t for t in rows}
    assert {i: by_id[i].status for i in ids} == {
        i: "falha" if i in failing else "sucesso" for i in ids
    }
    dead = [t for t in rows if t.dead]
    assert sorted(t.live_id for t in dead) == sorted(failing)
    assert all(t.status == "sucesso" for t in dead)
    assert sorted(effects(engine, app)) == sorted(
        [(i, i, f"{{'n': {n}}}") for n, i in enumerate(ids) if i not in failing]
        + [(t.id, t.id, "dead") for t in dead]
    )


# --------------------------------------------------------------------- scheduling
def test_task_scheduled_an_hour_ahead_is_left_waiting_by_a_burst_worker(
    engine: Engine, app: App, installed: None
) -> None:
    run_at = utcnow() + dt.timedelta(hours=1)
    [task_id] = enqueue(engine, app, {"n": 1}, run_at=run_at)
    drain(app.RecordingWorker, engine)

    [task] = tasks(engine, app)
    assert (task.id, task.status, task.run_at) == (task_id, "agendada", run_at)
    assert effects(engine, app) == []


def test_a_burst_worker_runs_a_task_promoted_by_another_process_after_its_empty_claim(
    engine: Engine, app: App, installed: None
) -> None:
    """A burst lane whose claim found nothing promotes the due tasks itself.
    If another process (a worker's schedule thread, ``maintenance run``)
    promoted one meanwhile, the lane's own promotion finds none: it must
    still claim once more before it leaves, or a ready task stays behind
    (CI caught it under load: the worker's own schedule thread was that
    other process)."""
    threads: list[set[str]] = []

    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            threads.append({thread.name for thread in threading.enumerate()})
            return super().execute(payload, task, session)

    [task_id] = enqueue(engine, app, {"n": 1}, run_at=utcnow() + dt.timedelta(hours=1))
    runner = Runner.for_worker(Worker(), engine=engine, settings=Settings(), burst=True)
    routine = runner._run_routine
    promotions: list[int] = []

    def promoted_elsewhere_first(name: str) -> Any:
        if name == "schedule" and not promotions:
            with engine.begin() as conn:  # the other process, committed
                promotions.append(
                    conn.execute(
                        update(app.Task)
                        .where(app.Task.id == task_id)
                        .values(status="pendente", run_at=utcnow())
                    ).rowcount
                )
        return routine(name)

    runner._run_routine = promoted_elsewhere_first  # type: ignore[method-assign]
    assert runner.run() == 0

    assert promotions == [1]
    # the burst's lanes promote; no schedule thread runs beside them
    [seen] = threads
    assert "sqla-queue-purge" in seen and "sqla-queue-schedule" not in seen
    assert [t.status for t in tasks(engine, app)] == ["sucesso"]
    assert effects(engine, app) == [(task_id, task_id, "{'n': 1}")]


def test_task_scheduled_seconds_ahead_runs_once_it_is_due(
    engine: Engine, app: App, installed: None
) -> None:
    ran_at: list[tuple[dt.datetime, dt.datetime]] = []

    class Worker(app.RecordingWorker):
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            ran_at.append((utcnow(), task.run_at))
            return super().execute(payload, task, session)

    run_at = utcnow() + dt.timedelta(seconds=2)
    [task_id] = enqueue(engine, app, {"n": 1}, run_at=run_at)
    assert [t.status for t in tasks(engine, app)] == ["agendada"]

    runner = Runner.for_worker(Worker(), engine=engine, settings=Settings())
    thread = threading.Thread(target=runner.run, name="test-runner")
    thread.start()
    try:
        wait_until(
            lambda: [t.status for t in tasks(engine, app)] == ["sucesso"],
            timeout=15,
            message="the scheduled task to succeed",
        )
    finally:
        runner.stop()
        thread.join(timeout=15)
    assert not thread.is_alive()

    [(handler_time, seen_run_at)] = ran_at
    assert seen_run_at == run_at
    assert handler_time >= run_at
    assert effects(engine, app) == [(task_id, task_id, "{'n': 1}")]


# --------------------------------------------------------------------- order, batching
@pytest.mark.parametrize("batch_size", [1, None], ids=["one-per-transaction", "batched"])
def test_ready_tasks_run_by_priority_then_age(
    engine: Engine, app: App, installed: None, batch_size: int | None
) -> None:
    ids = {}
    for priority in (10, 90, 50):
        [ids[priority]] = enqueue(engine, app, {"p": priority}, priority=priority)
    [later_90] = enqueue(engine, app, {"p": "90 later"}, priority=90)

    drain(app.RecordingWorker, engine, batch_size=batch_size)

    assert [task_id for task_id, _, _ in effects(engine, app)] == [
        ids[90],
        later_90,
        ids[50],
        ids[10],
    ]


@pytest.mark.parametrize("batch_size", [1, None], ids=["one-per-transaction", "batched"])
def test_every_handler_effect_commits_exactly_once(
    engine: Engine, app: App, installed: None, batch_size: int | None
) -> None:
    ids = enqueue(engine, app, *({"n": n} for n in range(60)))
    drain(app.RecordingWorker, engine, batch_size=batch_size)

    assert sorted(effects(engine, app)) == [(i, i, f"{{'n': {n}}}") for n, i in enumerate(ids)]
    assert {t.status for t in tasks(engine, app)} == {"sucesso"}
    assert len(tasks(engine, app)) == 60


def test_stop_hands_back_claimed_tasks_that_have_not_started(
    engine: Engine, app: App, installed: None
) -> None:
    ids = enqueue(engine, app, *({"n": n} for n in range(5)))
    worker = app.RecordingWorker()
    runner = Runner.for_worker(worker, engine=engine, settings=Settings())
    manager, adapter = runner.manager, runner.adapter
    with adapter.connect_claim(engine) as claim_conn, engine.connect() as work_conn:
        claimed = manager.claim(claim_conn, limit=5)
        assert [t.id for t in claimed] == ids
        result = manager.run_batch(
            claim_conn, work_conn, claimed, worker.dispatch, should_stop=lambda: True
        )
    assert (result.succeeded, result.failed, result.handed_back) == (1, 0, ids[1:])
    assert [t.status for t in tasks(engine, app)] == ["sucesso"] + ["pendente"] * 4
    assert effects(engine, app) == [(ids[0], ids[0], "{'n': 0}")]

    drain(app.RecordingWorker, engine)
    assert {t.status for t in tasks(engine, app)} == {"sucesso"}
    assert [task_id for task_id, _, _ in effects(engine, app)] == ids


def test_tasks_inserted_by_queue_client_are_processed(engine: Engine, app: App) -> None:
    past = utcnow() - dt.timedelta(minutes=1)
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        single = client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7}, prioridade=80)
        bulk = client.insert_tasks(
            [
                {"process": "faturar", "payload": {"invoice": 8}},
                {"process": "faturar", "payload": "texto simples", "run_at": past},
            ]
        )
    drain(app.RecordingWorker, engine)

    rows = tasks(engine, app)
    assert [(t.id, t.status, t.priority) for t in rows] == [
        (single, "sucesso", 80),
        (bulk[0], "sucesso", 50),
        (bulk[1], "sucesso", 50),
    ]
    assert [effect[:2] for effect in effects(engine, app)] == [
        (single, single),
        (bulk[1], bulk[1]),
        (bulk[0], bulk[0]),
    ]
    assert sorted(note for _, _, note in effects(engine, app)) == [
        "texto simples",
        "{'invoice': 7}",
        "{'invoice': 8}",
    ]


# --------------------------------------------------------------------- races, step by step


@pytest.mark.parametrize(
    "db_url",
    [
        "postgresql",
        "mysql",
    ],
    indirect=True,
)
def test_rescue_leaves_alone_a_task_that_finished_while_it_looked(
    engine: Engine, app: App, installed: None
) -> None:
    """A live worker finishes its task while the rescue is looking at the
    'processando' tasks (a start-up rescue among busy workers). SQLite is left
    out: its write lock runs the two one after the other."""
    [task_id] = enqueue(engine, app, {"n": 1})
    worker = app.RecordingWorker()
    runner = Runner.for_worker(worker, engine=engine, settings=Settings())
    manager, adapter = runner.manager, runner.adapter
    with (
        adapter.connect_claim(engine) as claim_conn,
        engine.connect() as work_conn,
        adapter.connect_maintenance(engine) as rescue_work,
    ):
        running = manager.claim(claim_conn, limit=1)
        assert [t.id for t in running] == [task_id]

        @event.listens_for(rescue_work, "after_cursor_execute")
        def finish_the_task(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
        ) -> None:
            if running and "processando" in f"{statement} {parameters}":
                manager.run_batch(claim_conn, work_conn, running, worker.dispatch)
                running.clear()

        rescued = manager.rescue(rescue_work)

    assert running == []  # the worker did finish while the rescue was looking
    assert rescued == 0
    assert [(t.id, t.status, t.message) for t in tasks(engine, app)] == [
        (task_id, "sucesso", SUCCESS)
    ]
    assert effects(engine, app) == [(task_id, task_id, "{'n': 1}")]


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_claim_and_promotion_running_at_once_both_complete(
    engine: Engine, app: App, installed: None, table_name: str
) -> None:
    """Two workers: one claims while the other promotes scheduled tasks. The
    promotion is started between the claim's locking read and its UPDATE."""
    ids = enqueue(engine, app, {"n": 1}, {"n": 2})
    runner = Runner.for_worker(app.RecordingWorker(), engine=engine, settings=Settings())
    manager, adapter = runner.manager, runner.adapter
    promoted: list[int] = []
    errors: list[BaseException] = []

    with adapter.connect_claim(engine) as claiming, adapter.connect_claim(engine) as promoting:

        def promote() -> None:
            try:
                with promoting.begin():
                    promoted.append(adapter.task_promote_due(promoting))
            except BaseException as exc:
                errors.append(exc)

        promotion = threading.Thread(target=promote)

        @event.listens_for(claiming, "before_cursor_execute")
        def promote_meanwhile(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
        ) -> None:
            if statement.lstrip().upper().startswith("UPDATE") and promotion.ident is None:
                promotion.start()
                wait_until(
                    lambda: lock_waits(engine, table_name) or not promotion.is_alive(),
                    interval=0.2,
                    message="the promotion to wait or finish",
                )

        claimed = manager.claim(claiming, limit=1)
        promotion.join(timeout=30)

    assert errors == []
    assert promoted == [0]
    assert [t.id for t in claimed] == ids[:1]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("given", ["url", "used engine"])
def test_every_sqlite_connection_of_a_worker_waits_out_the_write_lock(
    engine: Engine, app: App, installed: None, db_url: str, given: str
) -> None:
    """The worker reads its queue_configuration before it knows its adapter.
    The connection that read used to go back to the pool as pysqlite made it
    (a 5-second busy timeout, pysqlite's own BEGINs), and a lane later took
    it: under load, "database is locked" ended a burst worker. Now each
    connection is set up when it is checked out, whenever it was made."""
    if given == "url":
        runner = Runner.for_worker(
            app.RecordingWorker(), url=db_url, settings=Settings(), burst=True
        )
    else:
        used = create_engine(db_url)
        with used.connect() as conn:  # the application's own work, before the worker
            conn.execute(select(1))
        runner = Runner.for_worker(
            app.RecordingWorker(), engine=used, settings=Settings(), burst=True
        )
    try:
        assert runner.engine.pool.checkedin() == 1  # the connection made before the adapter
        with runner.engine.connect() as conn:
            raw: Any = conn.connection.dbapi_connection
            assert raw.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert raw.isolation_level is None
        [task_id] = enqueue(engine, app, {"n": 1})
        assert runner.run() == 0
        assert [row[0] for row in effects(engine, app)] == [task_id]
    finally:
        runner.engine.dispose()


def test_a_worker_runs_in_a_thread_of_the_application_and_stops_when_asked(
    engine: Engine, app: App, installed: None
) -> None:
    """The documented in-process way (docs/lifecycle.md, "In-process"): a
    QueueApp's parts, a Runner on them in a thread of the application's
    (no signal handlers there), and stop() from another thread, which lets
    the running batch finish and returns run() with 0."""
    first = enqueue(engine, app, {"n": 1}, {"n": 2})
    parts = QueueApp(app.RecordingWorker(), engine=engine, settings=Settings(), concurrency=2)
    runner = Runner(parts)
    returned: list[int] = []
    thread = threading.Thread(target=lambda: returned.append(runner.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(effects(engine, app)) == 2, message="the two tasks to run")
        later = enqueue(engine, app, {"n": 3})  # woken by NOTIFY, or by the poll
        wait_until(lambda: len(effects(engine, app)) == 3, message="a task enqueued later")
    finally:
        runner.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert returned == [0]
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == sorted(first + later)
    [after_stop] = enqueue(engine, app, {"n": 4})
    assert [t.status for t in tasks(engine, app) if t.id == after_stop] == ["pendente"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # NOTIFY wakes the lanes
def test_a_notification_wakes_one_idle_lane_not_every_lane(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four idle lanes (what the test engine's pool allows) and a task
    enqueued at a time: three claims a task (the woken lane's, which takes
    one task while other lanes wait and so wakes one more lane, whose claim
    finds nothing, and the busy lane's claim again after its task), where
    every idle lane claimed before, and then the busy one again: 4 or 5.
    Empty claims walk the dead index entries a pinned horizon keeps."""
    monkeypatch.setenv("QUEUE_WAIT_NOTIFY_INTERVAL", "120")  # no fallback poll in the test
    parts = QueueApp(app.RecordingWorker(), engine=engine, settings=Settings(), concurrency=4)
    runner = Runner(parts)
    claims: list[int] = []
    real_claim = runner.manager.claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        found = real_claim(*args, **kwargs)
        claims.append(len(found))
        return found

    monkeypatch.setattr(runner.manager, "claim", claim)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: runner.listener is not None and runner.listener.listening.is_set(),
            message="the LISTEN connection",
        )
        wait_until(lambda: len(claims) >= 4, message="every lane's first claim")
        wait_until(lambda: runner.wake._pending == 0, message="the start's wake-ups taken")
        before = len(claims)
        for n in range(10):
            enqueue(engine, app, {"n": n})
            wait_until(lambda n=n: len(effects(engine, app)) == n + 1, message=f"task {n}")
        made = len(claims) - before
    finally:
        runner.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    # before: 4 or 5 a task (the 4 lanes woken, then the busy one's re-claim);
    # 3 a task (30 in every run seen), a few more when a wake-up races the next
    assert made <= 35, (made, claims)
