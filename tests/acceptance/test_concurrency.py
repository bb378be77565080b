"""The real ``sqla-queue`` CLI in subprocesses: several workers, signals, wake-ups.

Subprocess workers import ``tests.support.app`` and build the same tables as the test
from ``SQLA_QUEUE_TEST_TABLE``. Every spawned process is killed in a
``finally`` if it is still running, and its output is read by a thread so a
full pipe never stalls a worker that holds a lock.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from sqla_queue import QueueClient
from sqla_queue.adapters import adapter_for
from sqla_queue.adapters.singlestore import SingleStoreAdapter
from sqla_queue.common.types import utcnow
from tests.conftest import lock_waits, run_cli, spawn_cli, wait_until
from tests.support.app import App

RECORDING = "tests.support.app:RecordingWorker"
BLOCKING = "tests.support.app:BlockingWorker"
RESCUED = (
    "Falha desconhecida de processamento (processamento abortado repentinamente). "
    "Tarefa reenfileirada."
)
NO_DATABASE = "Error: no database: pass --url, or set SQLA_QUEUE_URL or the DB_* variables"
DATABASE_VARIABLES = (
    "SQLA_QUEUE_URL",
    "DB_HOST",
    "DATABASE_HOST",
    "DB_BASE",
    "DATABASE_NAME",
    "DB_DRIVER",
    "DATABASE_DRIVER",
    "DB_PORT",
    "DATABASE_PORT",
    "DB_USER",
    "DATABASE_USER",
    "DB_PASS",
    "DATABASE_PASS",
)


# --------------------------------------------------------------------- helpers
class Spawned:
    """A CLI subprocess whose combined output is collected as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait(self, timeout: float = 60) -> int:
        """Its exit code; past ``timeout`` a failure that shows what every
        thread of the process was doing (``PYTHONFAULTHANDLER`` dumps the
        stacks at SIGABRT) and the output so far."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            self._reader.join(timeout=10)
            raise AssertionError(
                f"{' '.join(self.proc.args[3:5])} still running after {timeout:g} s; "
                f"its stacks at SIGABRT and its output:\n{self.output}"
            ) from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)


@contextlib.contextmanager
def spawned(*args: str, env: dict[str, str], count: int = 1) -> Iterator[list[Spawned]]:
    """``count`` CLI processes, killed on the way out if still running."""
    procs: list[Spawned] = []
    try:
        for _ in range(count):
            # stacks of every thread on a fatal signal (Spawned.wait's SIGABRT)
            procs.append(Spawned(spawn_cli(*args, env={"PYTHONFAULTHANDLER": "1", **env})))
        yield procs
    finally:
        for proc in procs:
            proc.kill()


def stop_gracefully(workers: list[Spawned]) -> None:
    """Every worker is still running (none exited on a fault): SIGTERM them
    all, and each must exit 0."""
    for worker in workers:
        assert worker.proc.poll() is None, worker.output
        worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output


def worker_env(table_name: str, **extra: str) -> dict[str, str]:
    return {"SQLA_QUEUE_TEST_TABLE": table_name, **extra}


def insert_tasks(engine: Engine, app: App, count: int, process: str = "bulk") -> list[int]:
    with engine.begin() as conn:
        return QueueClient(conn, app.Task).insert_tasks(
            {"process": process, "payload": {"n": n}} for n in range(count)
        )


def statuses(engine: Engine, app: App) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(app.Task.id, app.Task.status)).all())


def effects(engine: Engine, app: App) -> list[tuple[int, int, str | None]]:
    effect = app.Effect
    with engine.connect() as conn:
        rows = conn.execute(
            select(effect.task_id, effect.chain_id, effect.note).order_by(effect.id)
        )
        return [(task_id, chain_id, note) for task_id, chain_id, note in rows]


def tasks(engine: Engine, app: App) -> list[Any]:
    with Session(engine) as session:
        return list(session.scalars(select(app.Task).order_by(app.Task.id)))


def task_lock_is_free(engine: Engine, app: App, task_id: int) -> bool:
    """Whether no connection holds the worker's per-task lock on ``task_id``.
    The server frees a dead client's session locks once it notices the closed
    socket: soon after the kill, not at once."""
    table = app.Task.__table__
    adapter = adapter_for(engine.dialect, table, table.name)
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # pg_locks shows the two int4 keys of the adapter's lock as oids
            held = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
                    "AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database()) "
                    "AND classid = CAST(:classid AS oid) AND objid = CAST(:objid AS oid)"
                ),
                {
                    "classid": adapter.task_lock_namespace % 2**32,
                    "objid": (task_id % 2**32 - 2**31) % 2**32,
                },
            ).scalar()
            return held == 0
        name = adapter._lock_prefix(conn) + str(task_id)  # type: ignore[attr-defined]
        return conn.execute(text("SELECT IS_FREE_LOCK(:name)"), {"name": name}).scalar() == 1


# --------------------------------------------------------------------- many workers
def test_four_worker_processes_run_every_task_exactly_once(
    engine: Engine, app: App, db_url: str, table_name: str, workers: dict[str, str]
) -> None:
    # An async worker's statements on SQLite each go to aiosqlite's thread
    # and back to the loop (a profile: the loop waits for that thread half
    # its time), two thread wake-ups a statement, which a loaded two-core CI
    # machine makes slow: 2,000 tasks took 39 s in a green CI run, over 90
    # in two others, against 7 s on a quiet machine. Fewer tasks keep the
    # four processes racing for the same rows; a stall shows its stacks.
    count = 600 if engine.dialect.name == "sqlite" and "async" in workers["recording"] else 2000
    ids = insert_tasks(engine, app, count)
    with spawned(
        "worker",
        workers["recording"],
        "--url",
        db_url,
        "--burst",
        "--log-level",
        "WARNING",
        env=worker_env(table_name),
        count=4,
    ) as workers:
        deadline = time.monotonic() + 120
        for worker in workers:
            assert worker.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, worker.output

    done = effects(engine, app)
    assert len(done) == count
    assert sorted(task_id for task_id, _, _ in done) == sorted(ids)
    assert all(task_id == chain_id for task_id, chain_id, _ in done)
    assert set(statuses(engine, app).values()) == {"sucesso"}
    assert len(statuses(engine, app)) == count


# --------------------------------------------------------------------- signals
def test_sigterm_finishes_the_running_task_and_hands_back_the_rest(
    engine: Engine, app: App, db_url: str, table_name: str, tmp_path: Path, workers: dict[str, str]
) -> None:
    signals = tmp_path / "signals"
    signals.mkdir()
    go = signals / "go"
    go.touch()
    env = worker_env(table_name, SQLA_QUEUE_TEST_SIGNAL_DIR=str(signals))
    with spawned("worker", workers["blocking"], "--url", db_url, env=env) as [worker]:
        # quick tasks first, so that the worker's batches grow past one task
        # and the five below are claimed together
        warm_up = insert_tasks(engine, app, 7, process="warm-up")
        wait_until(
            lambda: {statuses(engine, app)[i] for i in warm_up} == {"sucesso"},
            message="the warm-up tasks",
            timeout=60,
        )
        go.unlink()
        ids = insert_tasks(engine, app, 5)
        wait_until(
            lambda: any((signals / f"started-{i}").exists() for i in ids), message="a task to start"
        )
        worker.proc.send_signal(signal.SIGTERM)
        # release the running task only once the worker has taken the signal:
        # else, on a loaded machine, the lane could start the next task first
        wait_until(
            lambda: "finishing running tasks" in worker.output, message="the signal's log line"
        )
        go.touch()
        assert worker.wait(timeout=60) == 0, worker.output

    [started] = [i for i in ids if (signals / f"started-{i}").exists()]
    after_stop = statuses(engine, app)
    assert {i: after_stop[i] for i in ids} == {
        i: "sucesso" if i == started else "pendente" for i in ids
    }
    assert "processando" not in after_stop.values()
    assert (started, started, "blocked") in effects(engine, app)

    run_cli("worker", workers["recording"], "--url", db_url, "--burst", env=env)
    assert set(statuses(engine, app).values()) == {"sucesso"}
    assert sorted(task_id for task_id, _, _ in effects(engine, app)) == sorted(warm_up + ids)


def lease_expired(engine: Engine, app: App, task_id: int) -> bool:
    with Session(engine) as session:
        task = session.get(app.Task, task_id)
        assert task is not None and task.lease_expires_at is not None
        return bool(task.lease_expires_at < utcnow())


def test_sigkill_leaves_the_task_processando_until_the_start_up_rescue(
    engine: Engine, app: App, db_url: str, table_name: str, tmp_path: Path, workers: dict[str, str]
) -> None:
    """PostgreSQL and MariaDB see the killed worker's lock die at once;
    SQLite, which has no such lock, rescues the task once its lease expires."""
    env = worker_env(
        table_name, SQLA_QUEUE_TEST_SIGNAL_DIR=str(tmp_path), SQLA_QUEUE_TEST_LEASE="1"
    )
    [task_id] = insert_tasks(engine, app, 1)
    with spawned("worker", workers["blocking"], "--url", db_url, env=env) as [worker]:
        wait_until(lambda: (tmp_path / f"started-{task_id}").exists(), message="the task")
        worker.proc.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    assert statuses(engine, app) == {task_id: "processando"}
    if db_url.startswith("sqlite"):
        wait_until(lambda: lease_expired(engine, app, task_id), message="the lease to expire")
    else:
        wait_until(
            lambda: task_lock_is_free(engine, app, task_id),
            message="the server to free the killed worker's lock",
        )

    run_cli("worker", workers["recording"], "--url", db_url, "--burst", env=env)

    lost, retry = tasks(engine, app)
    assert (lost.id, lost.status, lost.requeued, lost.message) == (
        task_id,
        "falha_processando",
        True,
        RESCUED,
    )
    assert lost.next_attempt_at == retry.run_at
    assert (
        retry.initial_id,
        retry.previous_id,
        retry.attempt,
        retry.previous_status,
        retry.previous_message,
        retry.status,
    ) == (task_id, task_id, 2, "falha_processando", RESCUED, "sucesso")
    assert effects(engine, app) == [(retry.id, task_id, "{'n': 0}")]


# --------------------------------------------------------------------- the CLI
def assert_clear_error(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cli_reports_a_worker_that_cannot_be_imported(tmp_path: Path) -> None:
    proc = run_cli(
        "worker",
        "nonexistent:Thing",
        "--url",
        f"sqlite:///{tmp_path / 'q.db'}",
        "--burst",
        check=False,
    )
    assert_clear_error(proc, "Error: cannot import 'nonexistent': No module named 'nonexistent'")


def test_cli_reports_a_worker_that_is_not_a_worker_class(tmp_path: Path) -> None:
    proc = run_cli(
        "worker",
        "tests.support.app:Effect",
        "--url",
        f"sqlite:///{tmp_path / 'q.db'}",
        "--burst",
        check=False,
    )
    assert_clear_error(proc, "Error: 'tests.support.app:Effect' is not a WorkerBase subclass")


def test_cli_reports_a_worker_class_the_module_does_not_have(tmp_path: Path) -> None:
    """Not "is not a WorkerBase subclass": the class is not there at all."""
    proc = run_cli(
        "worker",
        "tests.support.app:NoSuchWorker",
        "--url",
        f"sqlite:///{tmp_path / 'q.db'}",
        "--burst",
        check=False,
    )
    assert_clear_error(proc, "Error: module 'tests.support.app' has no 'NoSuchWorker'")


def test_cli_reports_an_unparseable_database_url() -> None:
    proc = run_cli("worker", RECORDING, "--url", "not a url", "--burst", check=False)
    assert_clear_error(proc, "Error: invalid database URL")


def test_cli_reports_an_unknown_database_driver() -> None:
    proc = run_cli(
        "worker", RECORDING, "--url", "postgress://u@localhost/db", "--burst", check=False
    )
    assert_clear_error(proc, "postgress")


def test_cli_reports_an_unreachable_database() -> None:
    proc = run_cli(
        "worker",
        RECORDING,
        "--url",
        "postgresql://postgres@127.0.0.1:1/test",
        "--burst",
        check=False,
    )
    assert_clear_error(proc, "127.0.0.1")


def test_cli_refuses_a_queue_table_that_does_not_exist(tmp_path: Path) -> None:
    proc = run_cli(
        "worker",
        RECORDING,
        "--url",
        f"sqlite:///{tmp_path / 'empty.db'}",
        env={"SQLA_QUEUE_TEST_TABLE": "fila_teste"},
        timeout=60,
        check=False,
    )
    assert_clear_error(proc, "Error: the queue table fila_teste does not exist in sqlite:///")


def test_cli_without_a_database_says_so() -> None:
    env = dict.fromkeys(DATABASE_VARIABLES, "")  # run_cli adds to os.environ: blank them
    proc = run_cli("worker", RECORDING, "--burst", env=env, check=False)
    assert_clear_error(proc, NO_DATABASE)


# --------------------------------------------------------------------- wake-ups
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_idle_worker_wakes_on_notify(
    engine: Engine, app: App, db_url: str, table_name: str, workers: dict[str, str]
) -> None:
    # the fallback poll is pushed to a minute: only the NOTIFY can wake the worker in time
    env = worker_env(table_name, QUEUE_WAIT_NOTIFY_INTERVAL="60")

    def activity(sql: str) -> int:
        with engine.connect() as conn:
            return conn.execute(text(sql), {"table": table_name}).scalar_one()

    with spawned("worker", workers["recording"], "--url", db_url, env=env) as [worker]:
        wait_until(
            lambda: activity(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"' || :table || '\"'"
            ),
            timeout=10,
            message="the worker to LISTEN",
        )
        # the lane's last query before it waits is its claim (the only
        # statement that sets a lease from the database's clock)
        wait_until(
            lambda: activity(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query LIKE "
                "'UPDATE ' || :table || "
                "' SET status=%worker_id=%lease_expires_at=(clock_timestamp()%'"
            ),
            timeout=15,
            message="the worker to go idle",
        )
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"INSERT INTO {table_name} (processo, payload) "
                    "VALUES ('notify', '{\"n\": 1}')"
                )
            )
        wait_until(
            lambda: set(statuses(engine, app).values()) == {"sucesso"},
            timeout=3,
            message="the NOTIFY to wake the worker",
        )
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    [(task_id, chain_id, note)] = effects(engine, app)
    assert (task_id == chain_id, note) == (True, "{'n': 1}")


def test_an_idle_worker_process_freezes_its_start_up_objects_once(
    engine: Engine, app: App, db_url: str, table_name: str, workers: dict[str, str]
) -> None:
    """``sqla-queue worker`` freezes what start-up made once its first lane
    goes idle (runner._settle: later full collections, which stop every
    lane, skip it); it then still runs tasks. The line is the worker's own
    word that gc.freeze ran: without the freeze there is none."""
    env = worker_env(table_name)
    args = ("worker", workers["recording"], "--url", db_url, "--log-level", "DEBUG")
    with spawned(*args, env=env) as [worker]:
        wait_until(
            lambda: "start-up objects frozen for the garbage collector" in worker.output,
            timeout=30,
            message="the idle worker to freeze its start-up objects",
        )
        [frozen] = re.findall(r"frozen for the garbage collector: (\d+)", worker.output)
        assert int(frozen) > 10_000  # SQLAlchemy's and the worker's objects, at least
        insert_tasks(engine, app, 3, process="notify")
        wait_until(
            lambda: set(statuses(engine, app).values()) == {"sucesso"},
            message="the tasks enqueued after the freeze to run",
        )
        stop_gracefully([worker])
    assert worker.output.count("start-up objects frozen") == 1


# --------------------------------------------------------------------- SingleStore claim
@pytest.fixture
def conditional(engine: Engine, app: App) -> SingleStoreAdapter:
    """The SingleStore adapter on MariaDB. No SingleStore server ran: its
    conditional-UPDATE claim is exercised on MariaDB's InnoDB instead."""
    table = app.Task.__table__
    return SingleStoreAdapter(table, table.name)


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_conditional_claim_gives_each_row_to_one_of_two_racing_connections(
    engine: Engine, app: App, conditional: SingleStoreAdapter
) -> None:
    """No SingleStore server ran: the SingleStore claim runs on MariaDB."""
    ids = insert_tasks(engine, app, 400)
    claimed: dict[int, list[int]] = {0: [], 1: []}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def claim_all(lane: int) -> None:
        try:
            with conditional.connect_claim(engine) as conn:
                start.wait(timeout=10)
                while True:
                    with conn.begin():
                        got = conditional.task_claim_many(
                            conn, limit=10, owner=f"lane{lane}", lease_seconds=30
                        )
                    claimed[lane].extend(task.id for task in got)
                    if not got and "pendente" not in statuses(engine, app).values():
                        return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim_all, args=(lane,)) for lane in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert not set(claimed[0]) & set(claimed[1])
    assert sorted(claimed[0] + claimed[1]) == ids
    assert set(statuses(engine, app).values()) == {"processando"}


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_conditional_claim_waits_out_an_open_claim_and_skips_its_rows(
    engine: Engine, app: App, conditional: SingleStoreAdapter, table_name: str
) -> None:
    """No SingleStore server ran: the SingleStore claim runs on MariaDB. One
    connection's claim is left uncommitted while the other claims the same
    rows: the second waits on the row locks, then takes only the rest."""
    ids = insert_tasks(engine, app, 10)
    second: list[int] = []

    def claim_up_to_ten() -> None:
        with conditional.connect_claim(engine) as conn, conn.begin():
            second.extend(
                task.id
                for task in conditional.task_claim_many(conn, limit=10, owner="b", lease_seconds=30)
            )

    thread = threading.Thread(target=claim_up_to_ten)
    with conditional.connect_claim(engine) as first_conn, first_conn.begin():
        first = [
            task.id
            for task in conditional.task_claim_many(
                first_conn, limit=5, owner="a", lease_seconds=30
            )
        ]
        assert first == ids[:5]
        thread.start()
        wait_until(
            lambda: lock_waits(engine, table_name),
            interval=0.2,
            message="the second claim to wait on the first one's row locks",
        )
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert second == ids[5:]
    assert set(statuses(engine, app).values()) == {"processando"}
