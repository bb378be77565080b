"""Fleet-wide concurrency limits (sqla_queue/limits.py, docs/limits.md):
4 worker processes of 2 lanes each never run more than 2 tasks of a
limited process at once, on every database, while an unlimited process
beside it runs on more lanes than that (so that the measure can see an
excess; not on SQLite, where one batch runs at a time); every task runs
once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, select, text

from sqla_queue import ConfigurationError, QueueApp, QueueClient
from sqla_queue.settings import Settings
from tests.acceptance.test_concurrency import effects, spawned, stop_gracefully, worker_env
from tests.conftest import wait_until
from tests.support.app import App
from tests.support.limits_app import LIMIT, most_at_once


def test_a_limited_process_never_runs_past_its_limit_across_the_fleet(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {"n": n}} for n in range(40)]
            + [{"process": "livre", "payload": {"n": n}} for n in range(40)]
        )
    env = worker_env(app.Task.__table__.name, SQLA_QUEUE_TEST_PROBE=str(tmp_path))
    args = ("worker", "tests.support.limits_app:LimitedWorker", "--url", db_url)
    # --burst: each exits 0 once nothing is ready (a late starter at once)
    with spawned(*args, "--concurrency", "2", "--burst", env=env, count=4) as workers:
        for worker in workers:
            assert worker.wait(timeout=90) == 0, worker.output
    done = effects(engine, app)
    assert len(done) == len({task_id for task_id, _, _ in done}) == 80  # each once
    assert 1 <= most_at_once(tmp_path, "limitado") <= LIMIT
    # the fleet did run tasks side by side: the unlimited process, past the
    # limit. Not on SQLite, whose one writer runs one batch at a time
    if engine.dialect.name != "sqlite":
        assert most_at_once(tmp_path, "livre") > LIMIT


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"p": 0}, r"concurrency_limits\['p'\] must be a whole number of at least 1"),
        ({"p": True}, "must be a whole number"),
        ({"": 2}, "a process must be a non-empty string"),
        ([("p", 2)], "must be a mapping of process to a number"),
    ],
)
def test_a_bad_limit_is_one_clear_error(app: App, limits: Any, message: str) -> None:
    class Bad(app.RecordingWorker):  # type: ignore[name-defined,misc]
        concurrency_limits = limits

    with pytest.raises(ConfigurationError, match=message) as caught:
        Bad.check_configuration()
    assert "\n" not in str(caught.value)


def test_the_main_claim_leaves_limited_processes_to_the_limited_claim(
    engine: Engine, app: App
) -> None:
    """In one process: a claim of 10 takes the limit's 2 tasks of the
    limited process and the rest from the others; the next takes none of
    the limited process while those 2 run."""

    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        concurrency_limits: ClassVar[dict[str, int]] = {"limitado": 2}

    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {}} for _ in range(5)]
            + [{"process": "livre", "payload": {}} for _ in range(5)]
        )
    queue = QueueApp(Worker(), engine=engine, settings=Settings())
    with queue.adapter.connect_claim(engine) as conn:
        first = queue.manager.claim(conn, limit=10)
        second = queue.manager.claim(conn, limit=10)
    assert sorted(t.process for t in first) == ["limitado"] * 2 + ["livre"] * 5
    assert second == []
    with engine.connect() as conn:
        statuses = conn.execute(select(app.Task.process, app.Task.status)).all()
    assert (
        sorted(s for p, s in statuses if p == "limitado") == ["pendente"] * 3 + ["processando"] * 2
    )


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_limited_backlog_drains_without_waiting_for_a_wake_up(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    """With LISTEN, an idle lane waits for a notification (the fallback
    poll here: a minute). A claim cut short by the limit is not "all there
    was": the lane claims again after its batch, so 12 tasks limited to 1
    at a time finish with no enqueue to wake anyone."""
    env = worker_env(
        app.Task.__table__.name,
        SQLA_QUEUE_TEST_PROBE=str(tmp_path),
        QUEUE_WAIT_NOTIFY_INTERVAL="60",
    )
    # enqueued before the worker starts: no notification is left to wake it
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {"n": n}} for n in range(12)]
        )
    args = ("worker", "tests.support.limits_app:DrainWorker", "--url", db_url)
    with spawned(*args, "--concurrency", "2", env=env) as workers:
        wait_until(lambda: len(effects(engine, app)) >= 12, timeout=30, message="the backlog")
        wait_until(
            lambda: listening(engine, app.Task.__table__.name), message="the worker to LISTEN"
        )
        stop_gracefully(workers)


def listening(engine: Engine, table: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"' || :t || '\"'"
                ),
                {"t": table},
            ).scalar_one()
        )
