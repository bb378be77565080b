"""Async workers in-process: coroutine handlers with an AsyncSession on the
batch's transaction, on SQLite, PostgreSQL and MariaDB.

The worker's processes, signals and faults (SIGTERM, SIGKILL, killed
connections, a database restart) are in tests/acceptance and tests/faults,
parametrised over the sync and the async worker classes.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from sqla_queue import WorkerBase
from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.config.settings import Settings
from sqla_queue.worker import Runner
from sqla_queue.worker import runner as runner_module
from sqla_queue.worker.aio import AsyncRunner
from tests.conftest import wait_until
from tests.integration.test_worker import effects, enqueue, tasks
from tests.support.app import App
from tests.support.async_app import AsyncApp
from tests.support.async_app import build as build_async

pytestmark = pytest.mark.usefixtures("installed")

CANCELLED = "TimeLimitExceeded: the handler ran past its time limit of 1 s and was cancelled"


@pytest.fixture
def aapp(app: App) -> AsyncApp:
    return build_async(app)


def drain(worker: type[WorkerBase], engine: Engine, **options: Any) -> Runner:
    kind = AsyncRunner if worker.is_async() else Runner
    runner = kind.for_worker(worker(), engine=engine, burst=True, settings=Settings(), **options)
    assert runner.run() == 0
    return runner


def test_async_handlers_run_on_the_batch_transaction_with_retries_and_dead_letter(
    engine: Engine, app: App, aapp: AsyncApp
) -> None:
    class Worker(aapp.Recording):  # type: ignore[name-defined,misc]
        max_retry = 2

    good = enqueue(engine, app, *({"n": n} for n in range(20)))
    [bad] = enqueue(engine, app, {"fail": "x"})
    runner = drain(Worker, engine, concurrency=3)
    assert isinstance(runner, AsyncRunner)

    by_id = {t.id: t for t in tasks(engine, app)}
    # each handler saw its own flushed row through its AsyncSession: one
    assert {by_id[i].status for i in good} == {"sucesso"}
    assert {by_id[i].message for i in good} == {"seen 1"}
    chain = [t for t in by_id.values() if t.id not in good]
    assert chain[0].id == bad
    assert [(t.attempt, t.dead, t.status) for t in chain] == [
        (1, False, "falha"),
        (2, False, "falha"),
        (1, True, "sucesso"),
    ]
    assert chain[0].message == "RuntimeError: asked to fail: x. Tarefa reenfileirada."
    assert chain[2].message == "dead handled"
    # the failed attempts' rows rolled back with their savepoints, alone
    done = effects(engine, app)
    assert sorted(task_id for task_id, _, note in done if note != "dead") == sorted(good)
    assert [task_id for task_id, _, note in done if note == "dead"] == [chain[2].id]


def test_a_failing_async_handler_rolls_back_alone(engine: Engine, app: App, aapp: AsyncApp) -> None:
    class Worker(aapp.Failing):  # type: ignore[name-defined,misc]
        max_retry = 1

    [task_id] = enqueue(engine, app, {"n": 1})
    drain(Worker, engine)
    first, dead = tasks(engine, app)
    assert (first.id, first.status, first.message) == (
        task_id,
        "falha",
        "ValueError: handler failed on purpose. Máximo de tentativas atingido.",
    )
    assert "raise ValueError" in first.error_traceback
    assert (dead.dead, dead.status) == (True, "sucesso")
    assert [note for _, _, note in effects(engine, app)] == ["dead"]


@pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
def test_coroutine_lanes_run_their_handlers_at_once(
    engine: Engine, app: App, aapp: AsyncApp, tmp_path: pathlib.Path, monkeypatch: Any
) -> None:
    """Four tasks, four coroutine lanes in one thread: all four handlers are
    waiting at the same time before any may finish. (Not SQLite: one writer,
    so its lanes' batch transactions run one after another, async or not.)"""
    monkeypatch.setenv("SQLA_QUEUE_TEST_SIGNAL_DIR", str(tmp_path))
    ids = enqueue(engine, app, *({"n": n} for n in range(4)))

    class Worker(aapp.Blocking):  # type: ignore[name-defined,misc]
        batch_size = 1

    runner = AsyncRunner.for_worker(
        Worker(), engine=engine, burst=True, concurrency=4, settings=Settings()
    )
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_until(
            lambda: all((tmp_path / f"started-{i}").exists() for i in ids),
            message="all four handlers running together",
        )
    finally:
        (tmp_path / "go").touch()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == ids


def test_a_coroutine_past_its_time_limit_is_cancelled_and_its_work_rolled_back(
    engine: Engine, app: App, aapp: AsyncApp
) -> None:
    [slow] = enqueue(engine, app, {"n": 0}, process="slow")
    drain(aapp.Slow, engine)
    first, dead = tasks(engine, app)
    assert (first.id, first.status) == (slow, "falha")
    assert first.message.startswith(CANCELLED)
    assert (dead.dead, dead.status) == (True, "sucesso")
    assert [note for _, _, note in effects(engine, app)] == ["dead"]


def test_a_handler_that_blocks_the_loop_is_named_in_a_warning(
    engine: Engine, app: App, aapp: AsyncApp, caplog: pytest.LogCaptureFixture
) -> None:
    [held] = enqueue(engine, app, {"hold": 0.8})
    with caplog.at_level(logging.WARNING, logger="sqla_queue.worker"):
        drain(aapp.HoldsLoop, engine)
    warnings = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert warnings, caplog.text
    assert f"task {held} " in warnings[0]
    assert "must not block" in warnings[0]
    assert [t.status for t in tasks(engine, app)] == ["sucesso"]


def test_sync_and_async_workers_share_one_table(engine: Engine, app: App, aapp: AsyncApp) -> None:
    ids = enqueue(engine, app, *({"n": n} for n in range(200)))
    threads = [
        threading.Thread(target=drain, args=(worker, engine), kwargs={"concurrency": 2})
        for worker in (aapp.Recording, app.RecordingWorker, aapp.Recording)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == ids
    assert {t.status for t in tasks(engine, app)} == {"sucesso"}


def test_an_idle_async_worker_is_woken_and_stops_at_once(
    engine: Engine, app: App, aapp: AsyncApp
) -> None:
    """Not burst: the lanes wait on the loop; a task enqueued later runs
    (NOTIFY on PostgreSQL, the poll elsewhere) and stop() ends the wait."""
    runner = AsyncRunner.for_worker(
        aapp.Recording(), engine=engine, concurrency=2, settings=Settings()
    )
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        [task_id] = enqueue(engine, app, {"n": 1})
        wait_until(
            lambda: [t.status for t in tasks(engine, app)] == ["sucesso"],
            message="the task to run",
        )
    finally:
        runner.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert effects(engine, app) == [(task_id, task_id, "{'n': 1}")]


def test_async_pubsub_subscribers(db_url: str, papp: Any, pengine: Engine) -> None:
    from sqla_queue import WorkerPubSubBase, subscriber
    from tests.integration.test_pubsub import add_subscribers, publish

    seen: list[tuple[str, Any]] = []

    class Subscribers(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber

        @subscriber("billing")
        async def billing(self, publication: Any, subscription: Any, task: Any, session: Any):
            await session.execute(text("SELECT 1"))
            await asyncio.sleep(0)
            seen.append(("billing", publication))
            return "billed"

        @subscriber("audit")
        async def audit(self, publication: Any, subscription: Any, task: Any, session: Any):
            seen.append(("audit", publication))

    add_subscribers(
        pengine,
        papp,
        {"id": "billing", "process": "pedido"},
        {"id": "audit", "process": "pedido"},
    )
    publish(pengine, papp, {"order": 7})
    assert Subscribers.is_async()
    runner = AsyncRunner.for_worker(Subscribers(), engine=pengine, burst=True, settings=Settings())
    assert isinstance(runner, AsyncRunner) and runner.run() == 0
    assert sorted(seen) == [("audit", {"order": 7}), ("billing", {"order": 7})]


# --------------------------------------------------------------- refusals
def test_a_worker_mixing_async_and_sync_handlers_is_refused(app: App) -> None:
    class Mixed(WorkerBase):
        model = app.Task

        async def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

        def execute_dead(self, payload: Any, task: Any, session: Any) -> None:
            return None

    with pytest.raises(ConfigurationError) as error:
        Mixed.check_configuration()
    assert str(error.value) == (
        "Mixed.execute_dead is not a coroutine function and other handlers of Mixed are: "
        "define every handler of a worker with async def, or every one with def"
    )


def test_an_async_generator_handler_is_refused(app: App) -> None:
    class Generator(WorkerBase):
        model = app.Task

        async def execute(self, payload: Any, task: Any, session: Any):  # type: ignore[no-untyped-def]
            yield None

    with pytest.raises(ConfigurationError, match=r"Generator\.execute is an async generator"):
        Generator.check_configuration()


def test_an_async_worker_on_in_memory_sqlite_is_refused(app: App, aapp: AsyncApp) -> None:
    with pytest.raises(ConfigurationError, match="cannot share an in-memory SQLite database"):
        AsyncRunner.for_worker(aapp.Recording(), url="sqlite://", settings=Settings())


def test_the_blocking_warning_threshold_is_checked(app: App, aapp: AsyncApp) -> None:
    class Wrong(aapp.Recording):  # type: ignore[name-defined,misc]
        blocking_warning_seconds = -1

    with pytest.raises(ConfigurationError, match=r"Wrong\.blocking_warning_seconds"):
        Wrong.check_configuration()


def test_the_async_lanes_use_their_own_engine(engine: Engine, app: App, aapp: AsyncApp) -> None:
    runner = AsyncRunner.for_worker(
        aapp.Recording(), engine=engine, concurrency=3, settings=Settings()
    )
    assert runner.lane_engine is not engine
    assert runner.lane_engine.dialect.is_async
    assert runner.lane_engine.pool.size() == 7  # two a lane and one fresh  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.execute(select(text("1"))).scalar() == 1
    runner.app.close()


def test_the_handlers_session_answers_as_an_async_session(
    engine: Engine, app: App, aapp: AsyncApp
) -> None:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    seen: list[Any] = []

    class Worker(aapp.Recording):  # type: ignore[name-defined,misc]
        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            connection = await session.connection()
            seen.append((type(session), type(session.bind), type(connection)))
            seen.append(session.bind.dialect.name)
            seen.append(await connection.scalar(text("SELECT 2")))
            return await super().execute(payload, task, session)

    enqueue(engine, app, {"n": 1})
    drain(Worker, engine)
    assert seen == [
        (AsyncSession, AsyncConnection, AsyncConnection),
        engine.dialect.name,
        2,
    ]
    assert [t.status for t in tasks(engine, app)] == ["sucesso"]


def test_each_runner_refuses_the_other_kind_of_worker(
    engine: Engine, app: App, aapp: AsyncApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # refused before anything is built: an async worker's app would make an
    # async engine that nothing disposes
    built: list[object] = []
    monkeypatch.setattr(runner_module, "QueueApp", lambda *a, **k: built.append(a))
    with pytest.raises(ConfigurationError) as error:
        Runner.for_worker(aapp.Recording(), engine=engine, settings=Settings())
    assert str(error.value) == (
        "Recording's handlers are coroutine functions: run it with "
        "sqla_queue.worker.AsyncRunner, or with its run()"
    )
    with pytest.raises(ConfigurationError, match="are not coroutine functions: run it with Runner"):
        AsyncRunner.for_worker(app.RecordingWorker(), engine=engine, settings=Settings())
    assert built == []


def test_run_chooses_the_runner(engine: Engine, app: App, aapp: AsyncApp) -> None:
    enqueue(engine, app, {"n": 1})
    assert aapp.Recording().run(engine=engine, burst=True, settings=Settings()) == 0
    assert [t.message for t in tasks(engine, app)] == ["seen 1"]
