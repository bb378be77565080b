"""sqla_queue.testing: the application's handlers run in its own test's
transaction, as a worker would run them, and nothing is committed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue import SqlaQueueError
from sqla_queue.config.settings import make_async_engine
from sqla_queue.testing import (
    aenqueued,
    arun_until_empty,
    awork_one,
    enqueued,
    run_until_empty,
    work_one,
)
from tests.support.app import App
from tests.support.async_app import build as build_async


@pytest.fixture
def session(engine: Engine, installed: None) -> Iterator[Session]:
    """The recipe of docs/testing.md: a session that joins a transaction
    the test rolls back."""
    with engine.connect() as conn:
        transaction = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        try:
            yield session
        finally:
            session.close()
            transaction.rollback()


def rows(engine: Engine, model: type) -> int:
    """How many rows another connection sees: only what is committed."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def test_run_until_empty_runs_successes_retries_and_the_dead_letter_and_commits_nothing(
    engine: Engine, app: App, session: Session
) -> None:
    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2  # retry_interval_minutes = 0: the retry is due at once

    session.add_all(
        [
            app.Task(process="faturar", payload={"n": 1}),
            app.Task(process="faturar", payload={"fail": "always"}),
        ]
    )
    session.flush()

    outcome = run_until_empty(Billing, session)

    assert (outcome.succeeded, outcome.failed, outcome.dead, outcome.dead_runs) == (1, 2, 1, 1)
    statuses = sorted(
        (task.attempt, task.dead, task.status) for task in session.scalars(select(app.Task))
    )
    assert statuses == [
        (1, False, "falha"),
        (1, False, "sucesso"),
        (1, True, "sucesso"),
        (2, False, "falha"),
    ]
    # the success's and the dead-letter run's work, in the test's transaction
    notes = sorted(str(note) for note in session.scalars(select(app.Effect.note)))
    assert notes == ["dead", "{'n': 1}"]
    assert rows(engine, app.Task) == 0 and rows(engine, app.Effect) == 0
    assert run_until_empty(Billing, session).succeeded == 0  # nothing left ready


def test_run_until_empty_sees_tasks_added_and_not_flushed(
    engine: Engine, app: App, session: Session
) -> None:
    """docs/testing.md's first example as written: session.add, then
    run_until_empty, no flush between (it saw nothing before)."""
    session.add(app.Task(process="faturar", payload={"n": 7}))

    outcome = run_until_empty(app.RecordingWorker, session)

    assert (outcome.succeeded, outcome.failed) == (1, 0)
    assert rows(engine, app.Task) == 0


def test_work_one_runs_the_given_task_only(engine: Engine, app: App, session: Session) -> None:
    first, second = (
        app.Task(process="faturar", payload={"n": 1}),
        app.Task(process="faturar", payload={"n": 2}),
    )
    session.add_all([first, second])
    session.flush()

    outcome = work_one(app.RecordingWorker, session, second)

    assert (outcome.succeeded, outcome.failed) == (1, 0)
    assert (first.status, second.status) == ("pendente", "sucesso")
    with pytest.raises(SqlaQueueError, match=rf"task {second.id} is sucesso, not pendente"):
        work_one(app.RecordingWorker, session, second.id)
    with pytest.raises(SqlaQueueError, match="task 987654321 does not exist"):
        work_one(app.RecordingWorker, session, 987654321)
    assert rows(engine, app.Task) == 0


def test_enqueued_finds_tasks_by_process_and_payload_subset(
    engine: Engine, app: App, session: Session
) -> None:
    session.add_all(
        [
            app.Task(process="email", payload={"order": 7, "to": "a@example.com"}),
            app.Task(process="email", payload={"order": 8}),
            app.Task(process="faturar", payload={"order": 7}),
        ]
    )
    assert len(enqueued(session, app.Task, process="email")) == 2
    [found] = enqueued(session, app.Task, process="email", payload={"order": 7})
    assert found.payload == {"order": 7, "to": "a@example.com"}
    assert len(enqueued(session, app.Task, payload={"order": 7})) == 2
    assert enqueued(session, app.Task, process="email", payload={"order": 9}) == []
    assert enqueued(session, app.Task, process="email", status="sucesso") == []


def test_the_async_twins_run_an_async_workers_handlers_in_the_tests_transaction(
    engine: Engine, app: App, session: Session
) -> None:
    """An async worker's handlers, run by arun_until_empty and awork_one on
    the test's AsyncSession: each handler gets an AsyncSession of the
    test's transaction, retries and the dead letter run, a time limit
    cancels, nothing is committed. The sync helpers refuse such a worker."""
    aapp = build_async(app)

    class Notify(aapp.Recording):  # type: ignore[name-defined,misc]
        max_retry = 2

    class Slow(aapp.Recording):  # type: ignore[name-defined,misc]
        max_retry = 1
        time_limit_seconds = 0.05

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            await asyncio.sleep(30)  # cancelled by the limit long before
            return None

    async def scenario() -> tuple[Any, ...]:
        async_engine = make_async_engine(engine.url, pool_size=1)
        try:
            async with async_engine.connect() as conn:
                transaction = await conn.begin()
                asession = AsyncSession(bind=conn, join_transaction_mode="create_savepoint")
                try:
                    asession.add_all(
                        [
                            app.Task(process="faturar", payload={"n": 1}),
                            app.Task(process="faturar", payload={"fail": "always"}),
                        ]
                    )
                    await asession.flush()
                    outcome = await arun_until_empty(Notify, asession)
                    done = await aenqueued(asession, app.Task, status="sucesso")
                    notes = sorted(
                        str(n) for n in (await asession.scalars(select(app.Effect.note)))
                    )
                    slow = app.Task(process="faturar", payload={"n": 2})
                    asession.add(slow)
                    await asession.flush()
                    limited = await awork_one(Slow, asession, slow.id)
                    await asession.refresh(slow)
                    return outcome, len(done), notes, limited, slow.status, slow.message
                finally:
                    await asession.close()
                    await transaction.rollback()
        finally:
            await async_engine.dispose()

    outcome, done, notes, limited, status, message = asyncio.run(scenario())
    assert (outcome.succeeded, outcome.failed, outcome.dead, outcome.dead_runs) == (1, 2, 1, 1)
    assert done == 2  # the success and the dead-letter run
    assert notes == ["dead", "{'n': 1}"]
    assert (limited.succeeded, limited.failed, limited.dead) == (0, 1, 1)
    assert status == "falha" and "time limit of 0.05 s" in message
    assert rows(engine, app.Task) == 0 and rows(engine, app.Effect) == 0
    with pytest.raises(SqlaQueueError) as refused:
        run_until_empty(Notify, session)
    assert str(refused.value) == (
        "Notify's handlers are coroutine functions: run them with "
        "await arun_until_empty(Notify, async_session) (or awork_one)"
    )
