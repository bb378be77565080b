"""Workers in client-server mode, with a real ``sqla-queue server`` process.

The core worker behaviours again (claim exclusivity, the retry chain and the
dead letter, the rescue after SIGKILL, the graceful stop), on MariaDB and
PostgreSQL, with CLIENT_SERVER_MODE=true: wake-ups come from the server,
per-task database locks are off and the rescue relies on leases alone. Then
the server's own faults: killed and restarted mid-run (nothing lost, nothing
run twice, no running task taken for lost), absent, or refusing the worker.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sqla_queue.server import ServerRefused, ServerWakeups
from tests.acceptance.test_concurrency import (
    RESCUED,
    effects,
    insert_tasks,
    lease_expired,
    spawned,
    statuses,
    stop_gracefully,
    tasks,
    worker_env,
)
from tests.conftest import run_cli, wait_until
from tests.support.app import App
from tests.support.queue_server import ServerProcess, running_server

BOTH = pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
MARIADB = pytest.mark.parametrize("db_url", ["mysql"], indirect=True)

RECORDING = "tests.support.app:RecordingWorker"
FAILING = "tests.support.app:FailingWorker"
BLOCKING = "tests.support.app:BlockingWorker"


@pytest.fixture
def server(engine: Engine, db_url: str, table_name: str) -> Iterator[ServerProcess]:
    with running_server(RECORDING, db_url, table_name) as process:
        yield process


def cs_env(server: ServerProcess, table_name: str, **extra: str) -> dict[str, str]:
    return worker_env(table_name, **server.env(**extra))


def all_succeeded(engine: Engine, app: App, ids: list[int]) -> bool:
    now = statuses(engine, app)
    return all(now.get(i) == "sucesso" for i in ids)


def exactly_once(engine: Engine, app: App, ids: list[int]) -> None:
    done = effects(engine, app)
    assert sorted(task_id for task_id, _, _ in done) == sorted(ids)
    assert set(statuses(engine, app).values()) == {"sucesso"}


# --------------------------------------------------------------------- the core behaviours
@BOTH
def test_idle_workers_woken_by_the_server_run_every_task_exactly_once(
    engine: Engine, app: App, db_url: str, table_name: str, server: ServerProcess
) -> None:
    # the workers' own polls are an hour apart: only the server's wake-ups
    # (it looks every 0.2 s here) can get these tasks run in time
    env = cs_env(
        server, table_name, SQLA_QUEUE_POLL_INTERVAL="3600", QUEUE_WAIT_NOTIFY_INTERVAL="3600"
    )
    with spawned("worker", RECORDING, "--url", db_url, env=env, count=2) as workers:
        wait_until(
            lambda: all("lane(s) on" in w.output for w in workers),
            message="the workers to start",
        )
        ids = insert_tasks(engine, app, 100)
        wait_until(lambda: all_succeeded(engine, app, ids), timeout=60, message="every task")
        stop_gracefully(workers)
    exactly_once(engine, app, ids)


@BOTH
def test_retry_chain_and_dead_letter_in_client_server_mode(
    engine: Engine, app: App, db_url: str, table_name: str, server: ServerProcess
) -> None:
    [first_id] = insert_tasks(engine, app, 1)
    with spawned("worker", FAILING, "--url", db_url, env=cs_env(server, table_name)) as workers:
        wait_until(
            lambda: any(t.dead and t.status == "sucesso" for t in tasks(engine, app)),
            timeout=60,
            message="the dead-letter run",
        )
        stop_gracefully(workers)
    rows = tasks(engine, app)
    assert [(t.attempt, t.dead, t.status, t.retries_exhausted) for t in rows] == [
        (1, False, "falha", False),
        (2, False, "falha", False),
        (3, False, "falha", True),
        (1, True, "sucesso", False),
    ]
    assert [t.initial_id for t in rows[1:3]] == [first_id, first_id]
    assert rows[3].live_id == first_id
    assert effects(engine, app) == [(rows[3].id, rows[3].id, "dead")]  # failures rolled back


@BOTH
def test_sigkill_is_rescued_once_the_lease_expires(
    engine: Engine, app: App, db_url: str, table_name: str, server: ServerProcess, tmp_path: Path
) -> None:
    env = cs_env(
        server, table_name, SQLA_QUEUE_TEST_SIGNAL_DIR=str(tmp_path), SQLA_QUEUE_TEST_LEASE="1"
    )
    [task_id] = insert_tasks(engine, app, 1)
    with spawned("worker", BLOCKING, "--url", db_url, env=env) as [worker]:
        wait_until(lambda: (tmp_path / f"started-{task_id}").exists(), message="the task")
        worker.proc.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    assert statuses(engine, app) == {task_id: "processando"}
    wait_until(lambda: lease_expired(engine, app, task_id), message="the lease to expire")

    run_cli("worker", RECORDING, "--url", db_url, "--burst", env=env)

    lost, retry = tasks(engine, app)
    assert (lost.id, lost.status, lost.message) == (task_id, "falha_processando", RESCUED)
    assert (retry.initial_id, retry.attempt, retry.status) == (task_id, 2, "sucesso")
    assert effects(engine, app) == [(retry.id, task_id, "{'n': 0}")]


@BOTH
def test_sigterm_finishes_the_running_task_and_hands_back_the_rest(
    engine: Engine, app: App, db_url: str, table_name: str, server: ServerProcess, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    go.touch()
    env = cs_env(server, table_name, SQLA_QUEUE_TEST_SIGNAL_DIR=str(tmp_path))
    with spawned("worker", BLOCKING, "--url", db_url, env=env) as [worker]:
        # quick tasks first, so that the batches grow and the five below go together
        warm_up = insert_tasks(engine, app, 7, process="warm-up")
        wait_until(lambda: all_succeeded(engine, app, warm_up), message="the warm-up tasks")
        go.unlink()
        ids = insert_tasks(engine, app, 5)
        wait_until(
            lambda: any((tmp_path / f"started-{i}").exists() for i in ids),
            message="a task to start",
        )
        worker.proc.send_signal(signal.SIGTERM)
        # the running task may finish only once the worker has taken the
        # signal: let go sooner and, on a loaded machine, the next task of the
        # batch could start before the signal's handler ran (seen in CI)
        wait_until(
            lambda: "finishing running tasks" in worker.output, message="the worker's SIGTERM line"
        )
        go.touch()
        assert worker.wait(timeout=60) == 0, worker.output
    [started] = [i for i in ids if (tmp_path / f"started-{i}").exists()]
    after = statuses(engine, app)
    assert {i: after[i] for i in ids} == {i: "sucesso" if i == started else "pendente" for i in ids}

    run_cli("worker", RECORDING, "--url", db_url, "--burst", env=env)
    exactly_once(engine, app, warm_up + ids)


# --------------------------------------------------------------------- the server's faults
@BOTH
def test_server_killed_and_restarted_mid_run_loses_nothing_and_runs_nothing_twice(
    engine: Engine, app: App, db_url: str, table_name: str, server: ServerProcess
) -> None:
    # leases of three seconds: a running task taken for lost would be rescued
    # (and show up as falha_processando) long before the run ends, and a
    # loaded machine's stalls stay inside one lease
    env = cs_env(server, table_name, SQLA_QUEUE_TEST_LEASE="3")
    ids = insert_tasks(engine, app, 500)

    def done() -> int:
        return sum(status == "sucesso" for status in statuses(engine, app).values())

    with spawned("worker", RECORDING, "--url", db_url, env=env, count=2) as workers:
        wait_until(lambda: done() >= 100, timeout=60, message="the run to get going")
        server.kill()
        before = done()
        assert before < len(ids), "the run ended before the server was killed"
        # the workers go on without it: claims are the database's
        wait_until(lambda: done() >= min(before + 100, len(ids)), message="progress without it")
        server.start()
        wait_until(
            lambda: all("is back" in w.output for w in workers),
            message="the workers to reconnect",
        )
        wait_until(lambda: all_succeeded(engine, app, ids), timeout=90, message="every task")
        stop_gracefully(workers)
    exactly_once(engine, app, ids)
    assert len(statuses(engine, app)) == len(ids)  # no retry row: nothing was rescued


@MARIADB
def test_without_a_server_workers_poll_and_lose_nothing(
    engine: Engine, app: App, db_url: str, table_name: str
) -> None:
    absent = ServerProcess(RECORDING, db_url, table_name)  # never started
    ids = insert_tasks(engine, app, 50)
    with spawned("worker", RECORDING, "--url", db_url, env=cs_env(absent, table_name)) as workers:
        wait_until(lambda: all_succeeded(engine, app, ids), message="every task, by polling")
        stop_gracefully(workers)
    assert "cannot reach the queue server at 127.0.0.1:" in workers[0].output
    exactly_once(engine, app, ids)


@MARIADB
def test_a_worker_the_server_refuses_stops_with_one_line(
    engine: Engine, db_url: str, table_name: str, server: ServerProcess
) -> None:
    wrong = cs_env(server, table_name, SQLA_QUEUE_SERVER_SECRET="not-the-secret-at-all")
    proc = run_cli("worker", RECORDING, "--url", db_url, env=wrong, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refused this client: authentication failed" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

    other_queue = ServerWakeups(server.settings, "fila_other_queue", client_name="w")
    with pytest.raises(ServerRefused, match=f"serves queue '{table_name}', not 'fila_other_q"):
        other_queue.start(threading.Event())

    no_secret = cs_env(server, table_name, SQLA_QUEUE_SERVER_SECRET="")
    proc = run_cli("worker", RECORDING, "--url", db_url, env=no_secret, check=False)
    assert proc.returncode == 1
    assert "Error: SQLA_QUEUE_SERVER_SECRET is not set" in proc.stderr
