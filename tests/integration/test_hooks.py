"""Observers of outcomes (sqla_queue.policies.hooks): called once the outcome is
committed, with the task; an observer that raises changes nothing."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, QueueApp, Runner, hooks
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.maintenance import ManualClock
from sqla_queue.policies.hooks import Hooks
from tests.conftest import wait_until
from tests.support.app import App


def enqueue(engine: Engine, app: App, *payloads: Any) -> list[int]:
    with Session(engine) as session, session.begin():
        tasks = [app.Task(payload=payload, process="faturar") for payload in payloads]
        session.add_all(tasks)
        session.flush()
        return [task.id for task in tasks]


def status_of(engine: Engine, app: App, task_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(select(app.Task.status).where(app.Task.id == task_id)).scalar())


def test_observers_see_each_outcome_after_its_commit(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

    ok, bad = enqueue(engine, app, {"n": 1}, {"fail": "always"})
    registry = Hooks()
    seen: list[tuple[str, int, int, bool, str]] = []
    batches: list[hooks.BatchEvent] = []

    def on_task(event: hooks.TaskEvent) -> None:
        # what another connection sees now: the outcome is already committed
        task = event.task
        seen.append(
            (event.event, task.chain_id, task.attempt, task.dead, status_of(observer, app, task.id))
        )

    for name in (hooks.TASK_SUCCEEDED, hooks.TASK_RETRIED, hooks.TASK_DEAD, hooks.TASK_FAILED):
        registry.add(name, on_task)
    registry.on(hooks.BATCH_COMMITTED)(batches.append)

    parts = QueueApp(Billing(), engine=engine, settings=Settings(), hooks=registry)
    assert Runner(parts, burst=True).run() == 0

    with engine.connect() as conn:
        [dead_run] = conn.execute(select(app.Task.id).where(app.Task.dead.is_(True))).scalars()
    assert sorted(seen) == sorted(
        [
            (hooks.TASK_SUCCEEDED, ok, 1, False, "sucesso"),
            (hooks.TASK_RETRIED, bad, 1, False, "falha"),
            (hooks.TASK_DEAD, bad, 2, False, "falha"),
            # the dead-letter run: a new chain, its handler returned
            (hooks.TASK_SUCCEEDED, dead_run, 1, True, "sucesso"),
        ]
    )
    assert sum(b.succeeded for b in batches) == 2
    assert sum(b.failed for b in batches) == 2
    assert all(b.seconds >= 0 and b.tasks >= 1 for b in batches)


def test_an_observer_that_raises_changes_no_outcome(
    engine: Engine, app: App, installed: None, caplog: pytest.LogCaptureFixture
) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    registry = Hooks()

    @registry.on(hooks.TASK_SUCCEEDED)
    def broken(event: hooks.TaskEvent) -> None:
        raise RuntimeError("the metrics backend is down")

    parts = QueueApp(app.RecordingWorker(), engine=engine, settings=Settings(), hooks=registry)
    with caplog.at_level(logging.WARNING, logger="sqla_queue.policies.hooks"):
        assert Runner(parts, burst=True).run() == 0
    assert status_of(engine, app, task_id) == "sucesso"
    [line] = [r.getMessage() for r in caplog.records if r.name == "sqla_queue.policies.hooks"]
    assert "broken" in line and "task_succeeded" in line and "metrics backend is down" in line


def test_the_rescue_reports_each_task_it_rescued(engine: Engine, app: App, installed: None) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    registry = Hooks()
    rescued: list[hooks.TaskEvent] = []
    registry.add(hooks.TASK_RESCUED, rescued.append)
    parts = QueueApp(app.RecordingWorker(), engine=engine, settings=Settings(), hooks=registry)
    try:
        with parts.adapter.connect_claim(engine) as claim_conn:
            [claimed] = parts.manager.claim(claim_conn, limit=1)
        # its worker is gone: the connection (and any lock) closed, the lease run out
        with engine.begin() as conn:
            conn.execute(
                update(app.Task)
                .where(app.Task.id == task_id)
                .values(lease_expires_at=utcnow() - dt.timedelta(minutes=5))
            )
        parts.claims.discard([claimed.id])
        assert parts.maintenance.run_now("rescue").counts.get("rescued") == 1
    finally:
        parts.close()
    assert [(e.event, e.task.id) for e in rescued] == [(hooks.TASK_RESCUED, task_id)]
    assert status_of(engine, app, task_id) == "falha_processando"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_scheduled_routine_run_is_reported(engine: Engine, app: App) -> None:
    registry = Hooks()
    runs: list[hooks.RoutineEvent] = []
    registry.add(hooks.ROUTINE_RAN, runs.append)
    clock = ManualClock(dt.datetime(2030, 1, 1, 0, 0, 30, tzinfo=dt.timezone.utc))
    parts = QueueApp(
        app.RecordingWorker(), engine=engine, settings=Settings(), clock=clock, hooks=registry
    )
    parts.maintenance.start()
    try:
        clock.advance(60)
        wait_until(
            lambda: any(run.routine == "schedule" for run in runs),
            message="the schedule routine's run to be reported",
        )
    finally:
        parts.close()
    run = next(run for run in runs if run.routine == "schedule")
    assert run.event == hooks.ROUTINE_RAN and run.error is None and run.seconds >= 0


def test_an_unknown_event_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigurationError, match="no event 'task_done': one of batch_committed"):
        hooks.on("task_done")
