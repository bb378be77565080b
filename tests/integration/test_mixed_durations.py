"""Tasks of mixed durations: a slow task holds nothing but itself.

A lane commits its outcomes in groups (sqla_queue/batch/transaction.py); while a
slow handler runs, the commit watch (worker/commitwatch.py) commits its
finished batch-mates and hands its waiting ones back. Every test here runs
on SQLite, PostgreSQL and MariaDB; a slow handler waits for an event the
test sets only once it has seen what must happen while it runs, so nothing
here depends on timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from sqla_queue import WorkerBase
from sqla_queue.batch.transaction import JoinPolicy, Lane, ThreadGate
from sqla_queue.common.logs import TASK_FIELDS
from sqla_queue.config.settings import Settings
from sqla_queue.schema.records import TaskRecord
from sqla_queue.worker import Runner
from sqla_queue.worker.aio import AsyncRunner
from sqla_queue.worker.commitwatch import CommitWatch
from tests.conftest import wait_until
from tests.support.app import App

SLOW = {"slow": True}


def _sync_worker(
    app: App, gate: threading.Event, started: threading.Event | None = None
) -> type[WorkerBase]:
    class Mixed(app.RecordingWorker):  # type: ignore[name-defined, misc]
        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if payload.get("slow"):
                if started is not None:
                    started.set()
                assert gate.wait(60), "the test never let the slow task finish"
            return super().execute(payload, task, session)

    return Mixed


def _async_worker(app: App, gate: threading.Event) -> type[WorkerBase]:
    Effect = app.Effect

    class AsyncMixed(WorkerBase):
        model = app.Task

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if payload.get("slow"):
                assert await asyncio.to_thread(gate.wait, 60), "never let finish"
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="done"))
            return None

        async def execute_dead(self, payload: Any, task: Any, session: Any) -> str | None:
            return None

    return AsyncMixed


def _enqueue(engine: Engine, app: App, payloads: list[dict[str, Any]]) -> list[int]:
    with Session(engine) as session, session.begin():
        rows = [app.Task(process="faturar", payload=payload) for payload in payloads]
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


def _rows(engine: Engine, app: App) -> dict[int, Any]:
    with Session(engine) as session:
        return {row.id: row for row in session.scalars(select(app.Task))}


def _effects(engine: Engine, app: App) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(app.Effect.task_id)).scalars())


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # a failed test must not leave a handler waiting


class _CommittedWhenLogged(logging.Handler):
    """Looks, for every 'succeeded' line, whether the task's sucesso is
    committed yet (read on another connection)."""

    def __init__(self, observer: Engine, app: App) -> None:
        super().__init__()
        self.observer, self.app = observer, app
        self.seen: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        task_id = getattr(record, TASK_FIELDS, {}).get("task_id")
        if task_id is None or "succeeded" not in record.getMessage():
            return
        with self.observer.connect() as conn:
            status = conn.execute(
                select(self.app.Task.status).where(self.app.Task.id == task_id)
            ).scalar_one()
        self.seen[task_id] = status


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_quick_tasks_commit_while_a_slow_neighbour_runs(
    engine: Engine, observer: Engine, app: App, installed: None, gate: threading.Event, kind: str
) -> None:
    """41 tasks enqueued together, the 21st slow: the 40 quick ones all
    commit while it still runs, each task's times are its own, and the log
    says 'succeeded' only of committed tasks."""
    payloads = [{"n": n} for n in range(20)] + [SLOW] + [{"n": n} for n in range(20, 40)]
    ids = _enqueue(engine, app, payloads)
    slow_id = ids[20]
    quick = [task_id for task_id in ids if task_id != slow_id]
    worker = (_sync_worker if kind == "sync" else _async_worker)(app, gate)
    kind_of_runner = Runner if kind == "sync" else AsyncRunner
    runner = kind_of_runner.for_worker(worker(), engine=engine, concurrency=2, settings=Settings())
    logged = _CommittedWhenLogged(observer, app)
    logs = logging.getLogger("sqla_queue.batch.manager")
    level = logs.level
    logs.setLevel(logging.INFO)
    logs.addHandler(logged)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_until(
            lambda: all(_rows(observer, app)[i].status == "sucesso" for i in quick),
            timeout=60,
            message="the quick tasks to commit while the slow one runs",
        )
        assert _rows(observer, app)[slow_id].status == "processando"
        gate.set()
        wait_until(
            lambda: _rows(observer, app)[slow_id].status == "sucesso",
            message="the slow task to commit",
        )
    finally:
        gate.set()
        runner.stop()
        thread.join(60)
        logs.removeHandler(logged)
        logs.setLevel(level)
    assert not thread.is_alive()
    assert _effects(engine, app) == sorted(ids)  # each once
    rows = _rows(engine, app)
    slow = rows[slow_id]
    assert slow.finished_at is not None and slow.started_at is not None
    # the slow task finished after every quick one was committed: its own time
    assert all(rows[i].finished_at < slow.finished_at for i in quick)
    if kind == "sync":  # the async worker's lines say the same; one kind suffices
        assert set(logged.seen) == set(ids)
        assert set(logged.seen.values()) == {"sucesso"}


def test_a_slow_task_s_batch_mates_commit_or_go_back_while_it_runs(
    engine: Engine, observer: Engine, app: App, installed: None, gate: threading.Event
) -> None:
    """One claim of [quick, slow, quick, quick]: while the slow handler runs
    (it has not touched the database), the watch commits the first quick
    task's outcome and hands the two waiting ones back for others."""
    first, slow_id, third, fourth = _enqueue(engine, app, [{"n": 1}, SLOW, {"n": 3}, {"n": 4}])
    slow_started = threading.Event()
    worker = _sync_worker(app, gate, slow_started)()
    runner = Runner.for_worker(worker, engine=engine, settings=Settings())
    manager = runner.manager
    manager.commit_budget = 0.1
    lane = Lane(0, ThreadGate(), manager.commit_budget)
    # "another lane is idle" once the slow task runs: the quick first task,
    # however slow a loaded machine makes it, hands nothing back
    watch = CommitWatch(
        manager, [lane], single_writer=runner.adapter.single_writer, idle_lane=slow_started.is_set
    )
    lane.on_start = watch.busy
    outcome: list[Any] = []
    with runner.adapter.connect_claim(engine) as claim, engine.connect() as work:
        claimed = manager.claim(claim, limit=4)
        assert [t.id for t in claimed] == [first, slow_id, third, fourth]
        watch.start()
        batch = threading.Thread(
            target=lambda: outcome.append(
                manager.run_batch(claim, work, claimed, worker.dispatch, lane=lane)
            )
        )
        batch.start()
        try:
            wait_until(
                lambda: (
                    [_rows(observer, app)[i].status for i in (first, third, fourth)]
                    == ["sucesso", "pendente", "pendente"]
                ),
                message="the first committed and the waiting two handed back",
            )
            assert _rows(observer, app)[slow_id].status == "processando"
            gate.set()
            batch.join(60)
        finally:
            gate.set()
            watch.stop()
    [result] = outcome
    assert (result.succeeded, result.failed, sorted(result.handed_back)) == (
        2,
        0,
        sorted([third, fourth]),
    )
    rows = _rows(engine, app)
    assert (rows[slow_id].status, rows[third].started_at, rows[third].worker_id) == (
        "sucesso",
        None,
        None,
    )
    assert _effects(engine, app) == sorted([first, slow_id])


def test_a_handler_that_ran_long_after_its_first_statement_joins_no_outcome_next_time(
    engine: Engine, observer: Engine, app: App, installed: None, gate: threading.Event
) -> None:
    """The join policy learns: once a handler of a process has run long
    after its first statement, the next one's first statement commits the
    outcomes waiting before it starts its own transaction."""
    started: list[int] = []
    Effect = app.Effect

    class ReadThenWork(WorkerBase):
        model = app.Task

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if payload.get("slow"):
                session.execute(text("SELECT 1"))  # its transaction opens here
                started.append(task.id)
                if len(started) == 1:
                    time.sleep(0.2)  # the first: its own long work, nothing warned of it
                else:
                    assert gate.wait(60)
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="done"))
            return None

    worker = ReadThenWork()
    runner = Runner.for_worker(worker, engine=engine, settings=Settings())
    manager = runner.manager
    manager.commit_budget = 0.05
    manager._joins.memory = 10_000  # remembered for the whole test, however slow the machine
    for round_ in range(2):
        quick_id, slow_id = _enqueue(engine, app, [{"n": round_}, SLOW])
        with runner.adapter.connect_claim(engine) as claim, engine.connect() as work:
            claimed = manager.claim(claim, limit=2)
            assert [t.id for t in claimed] == [quick_id, slow_id]
            batch = threading.Thread(
                target=manager.run_batch, args=(claim, work, claimed, worker.dispatch)
            )
            batch.start()
            if round_ == 1:
                wait_until(lambda: len(started) == 2, message="the second slow handler")
                # warned: the quick task's outcome committed before its first statement
                assert _rows(observer, app)[quick_id].status == "sucesso"
                gate.set()
            batch.join(60)
        assert _rows(observer, app)[slow_id].status == "sucesso"


# ------------------------------------------------------------ the policy alone
def _lane_running(task: TaskRecord, *, started: float, outcomes: int, oldest: float) -> Lane:
    lane = Lane(0, ThreadGate(), 0.01)
    lane.running, lane.running_since = task, started
    lane.group.tasks = [task] * outcomes
    lane.oldest = oldest if outcomes else None
    return lane


def _task(process: str = "faturar") -> TaskRecord:
    return TaskRecord(id=1, process=process)


def test_the_join_policy() -> None:
    policy = JoinPolicy(0.01)
    now = 1000.0

    def young(at: float, process: str = "faturar") -> Lane:
        """A handler that reached the database 1 ms after its start, beside
        two outcomes 2 ms old."""
        return _lane_running(_task(process), started=at - 0.001, outcomes=2, oldest=at - 0.002)

    assert policy.may_join(young(now), now)
    assert not policy.may_join(  # nothing to join
        _lane_running(_task(), started=now, outcomes=0, oldest=now), now
    )
    assert not policy.may_join(  # already as many outcomes as may wait for it
        _lane_running(_task(), started=now, outcomes=JoinPolicy.MAX_JOINED, oldest=now), now
    )
    assert not policy.may_join(  # outcomes that have waited most of the budget
        _lane_running(_task(), started=now, outcomes=1, oldest=now - 0.008), now
    )
    assert not policy.may_join(  # a handler slow to reach the database
        _lane_running(_task(), started=now - 0.003, outcomes=1, oldest=now - 0.001), now
    )
    # a handler of "faturar" ran 2 s after its first statement: its process
    # is kept apart 20 s, another process is not
    long = _lane_running(_task(), started=now - 2.1, outcomes=0, oldest=now)
    long.joined, long.joined_at = True, now - 2.0
    policy.finished(long, _task(), now)
    assert not policy.may_join(young(now + 19), now + 19)
    assert policy.may_join(young(now + 21), now + 21)
    assert policy.may_join(young(now + 1, "enviar"), now + 1)
    # a short stall after the first statement keeps it apart only briefly
    stall = _lane_running(_task("enviar"), started=now, outcomes=0, oldest=now)
    stall.joined, stall.joined_at = True, now - 0.006
    policy.finished(stall, _task("enviar"), now)
    assert not policy.may_join(young(now + 0.05, "enviar"), now + 0.05)
    assert policy.may_join(young(now + 0.07, "enviar"), now + 0.07)
    # a handler that never reached the database teaches nothing
    quiet = _lane_running(_task("enviar"), started=now - 5, outcomes=0, oldest=now)
    policy.finished(quiet, _task("enviar"), now + 1)
    assert policy.may_join(young(now + 1, "enviar"), now + 1)
