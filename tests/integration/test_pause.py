"""Pausing a process across the whole fleet: real worker processes, paused
and resumed by the CLI while they run, on every database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError
from sqla_queue.client.pause import pause, paused_processes, resume
from sqla_queue.config.settings import Settings
from sqla_queue.schema.configuration_table import configuration_table_of
from tests.conftest import wait_until
from tests.integration.test_worker import enqueue
from tests.support.app import App

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(db_url: str, table: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli", *args[:1], "tests.support.app:RecordingWorker",
         "--url", db_url, *args[1:]],
        env={**os.environ, "SQLA_QUEUE_TEST_TABLE": table, "PYTHONPATH": REPO},
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


class Worker:
    """A worker process whose log lines are collected as they come."""

    def __init__(self, db_url: str, table: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sqla_queue.cli", "worker", "tests.support.app:RecordingWorker",
             "--url", db_url, "--concurrency", "2", "--log-level", "INFO"],
            env={**os.environ, "SQLA_QUEUE_TEST_TABLE": table, "PYTHONPATH": REPO},
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self.reader.join(10)
        return code


def statuses(engine: Engine, app: App, process: str) -> dict[str, int]:
    t = app.Task
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.status, func.count()).where(t.process == process).group_by(t.status)
        )
        return {status: n for status, n in rows}


# a fleet of worker processes and the CLI: PostgreSQL and SQLite (the
# embedded default); the same statements on MariaDB are in the tests below
@pytest.mark.parametrize("db_url", ["postgresql", "sqlite"], indirect=True)
def test_a_paused_process_waits_across_the_fleet_until_resumed(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    table = app.Task.__tablename__
    fleet = [Worker(db_url, table) for _ in range(2)]
    try:
        for member in fleet:
            wait_until(lambda m=member: m.said("lane(s) on"), timeout=60, message="a start")
        paused = cli(db_url, table, "pause", "--process", "a")
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("paused: a ")
        # every worker of the fleet sees it (within its 2 s check)
        for member in fleet:
            wait_until(lambda m=member: m.said("paused processes (not claimed): a"), timeout=30)
        enqueue(engine, app, *({"n": n} for n in range(15)), process="a")
        enqueue(engine, app, *({"n": n} for n in range(15)), process="b")
        # b's tasks, enqueued after a's, all run; a's stay queued
        wait_until(lambda: statuses(engine, app, "b") == {"sucesso": 15}, timeout=60)
        assert statuses(engine, app, "a") == {"pendente": 15}
        shown = json.loads(cli(db_url, table, "status", "--json").stdout)
        assert shown["paused"] == ["a"]
        assert shown["processes"]["a"]["ready"] == 15

        resumed = cli(db_url, table, "resume", "--all")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == "resumed: a; still paused: none"
        wait_until(lambda: statuses(engine, app, "a") == {"sucesso": 15}, timeout=60)
        for member in fleet:
            wait_until(lambda m=member: m.said("no process is paused any more"), timeout=30)
    finally:
        codes = [member.stop() for member in fleet]
    assert codes == [0, 0]


def test_pause_and_resume_from_python(engine: Engine, app: App, installed: None) -> None:
    with engine.begin() as conn:
        assert paused_processes(conn, app.Task) == frozenset()  # no table yet
        assert pause(conn, app.Task, ["a", "b"]) == {"a", "b"}
        assert pause(conn, app.Task, ["b", "c"]) == {"a", "b", "c"}
        assert resume(conn, app.Task, ["b", "zzz"]) == {"a", "c"}
        with pytest.raises(ConfigurationError, match="no comma"):
            pause(conn, app.Task, ["x,y"])
    with engine.connect() as conn:
        assert paused_processes(conn, app.Task) == {"a", "c"}
    # the configuration table made for it has the one row: no other setting
    # of the worker changed
    with Session(engine) as session:
        rows = session.execute(
            select(func.count()).select_from(configuration_table_of(app.Task))
        ).scalar_one()
    assert rows == 1


def test_a_worker_of_only_paused_processes_claims_nothing(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    class OnlyA(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"a"})

    enqueue(engine, app, *({"n": n} for n in range(3)), process="a")
    with engine.begin() as conn:
        pause(conn, OnlyA.queue_model(), ["a"])
    assert OnlyA().run(engine=engine, burst=True, settings=Settings()) == 0
    assert statuses(engine, app, "a") == {"pendente": 3}
    with engine.begin() as conn:
        resume(conn, OnlyA.queue_model(), ["a"])
    assert OnlyA().run(engine=engine, burst=True, settings=Settings()) == 0
    assert statuses(engine, app, "a") == {"sucesso": 3}
