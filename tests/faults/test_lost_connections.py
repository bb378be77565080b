"""A long-running worker (the real CLI) under lost connections.

It must survive any loss of its connections, reconnect and carry on without
being restarted; a task that kills its own connection every time must use up
its attempts and reach the dead letter instead of crash-looping; and errors
that waiting cannot fix must stop the worker with one clear line.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, create_engine, make_url

from tests.acceptance.test_concurrency import (
    effects,
    insert_tasks,
    spawned,
    statuses,
    stop_gracefully,
    worker_env,
)
from tests.conftest import run_cli, wait_until
from tests.integration.test_worker import tasks
from tests.support.app import App, build

RECORDING = "tests.support.app:RecordingWorker"
servers = pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)


@servers
def test_task_that_kills_its_connection_reaches_the_dead_letter_and_the_worker_lives(
    engine: Engine, app: App, db_url: str, table_name: str, workers: dict[str, str]
) -> None:
    [poison] = insert_tasks(engine, app, 1, process="poison")
    with engine.begin() as conn:
        conn.execute(
            app.Task.__table__.update()
            .where(app.Task.id == poison)
            .values(payload='{"kill": true}', payload_hash=None)
        )
    with spawned("worker", workers["killer"], "--url", db_url, env=worker_env(table_name)) as [
        worker
    ]:
        wait_until(
            lambda: any(t.dead and t.status == "sucesso" for t in tasks(engine, app)),
            timeout=60,
            message="the dead-letter run of the poison task",
        )
        healthy = insert_tasks(engine, app, 3)
        wait_until(
            lambda: all(statuses(engine, app)[i] == "sucesso" for i in healthy),
            message="the healthy tasks after the poison one",
        )
        stop_gracefully([worker])
    chain = [t for t in tasks(engine, app) if t.process == "poison"]
    assert [(t.attempt, t.dead, t.status) for t in chain] == [
        (1, False, "falha"),
        (2, False, "falha"),
        (1, True, "sucesso"),
    ]
    assert "connection to the database lost while the task ran" in chain[0].message
    assert "lost the database" in worker.output and "reconnecting" in worker.output
    assert "Traceback" not in worker.output
    assert (
        sorted(task_id for task_id, _, _ in effects(engine, app) if task_id in healthy) == healthy
    )


@pytest.fixture(params=["postgresql", "mysql"])
def private_server(request: pytest.FixtureRequest) -> tuple[str, Callable[[], list[int]]]:
    """A database server of the test's own (its URL, and a function that kills
    every client connection but its caller's): killing connections on the
    shared servers would hit other suites running there."""
    if request.param == "postgresql":
        server = request.getfixturevalue("private_postgres")
        return server.url, server.terminate_backends
    server = request.getfixturevalue("private_mariadb")
    return server.url, server.kill_connections


def test_worker_whose_connections_are_all_killed_carries_on_exactly_once(
    private_server: tuple[str, Callable[[], list[int]]], table_name: str, workers: dict[str, str]
) -> None:
    url, kill_connections = private_server
    app = build(table_name)
    engine = create_engine(url, pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    try:
        with spawned(
            "worker",
            workers["recording"],
            "--url",
            url,
            "--concurrency",
            "2",
            env=worker_env(table_name),
        ) as [worker]:
            ids: list[int] = []
            for _ in range(5):
                ids += insert_tasks(engine, app, 200)
                wait_until(
                    lambda: "sucesso" in statuses(engine, app).values(), message="a task to run"
                )
                assert kill_connections(), worker.output
            wait_until(
                lambda: not {"pendente", "processando"} & set(statuses(engine, app).values()),
                timeout=90,
                message="every task to finish",
            )
            stop_gracefully([worker])
        finished = [t for t in tasks(engine, app) if t.status == "sucesso"]
        done = effects(engine, app)
        # every chain finished once, and each effect belongs to a 'sucesso' attempt
        assert sorted({t.initial_id or t.id for t in finished}) == ids
        assert sorted(task_id for task_id, _, _ in done) == sorted(t.id for t in finished)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("kind", "wrong"),
    [
        ("postgresql", {"database": "sqlaq_no_such_database"}),
        ("postgresql", {"username": "sqlaq_no_such_role"}),
        ("mysql", {"database": "sqlaq_no_such_database"}),
        ("mysql", {"username": "sqlaq_no_such_user"}),
    ],
)
def test_long_running_worker_stops_on_an_error_that_waiting_cannot_fix(
    kind: str, wrong: dict[str, str]
) -> None:
    from tests.conftest import server_url

    # the configured server (it is up), a database or user it does not have,
    # and the plain scheme a user writes (postgresql://, mysql://)
    url = make_url(server_url(kind)).set(drivername=kind, **wrong)
    proc = run_cli(
        "worker",
        RECORDING,
        "--url",
        url.render_as_string(hide_password=False),
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert "database error on" in line
    assert "Traceback" not in proc.stdout + proc.stderr
