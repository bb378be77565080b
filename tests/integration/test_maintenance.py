"""The maintenance routines on PostgreSQL, MariaDB and SQLite.

Time logic runs on a :class:`ManualClock` (the schedules, the purge's and
the TTL's ages): no test sleeps for a slot to come. Workers are ``Runner``
objects, not started, each with its own routines and lock; the race test
starts their maintenance threads only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pty
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, Table, create_engine, delete, func, select, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, WorkerBase
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.config.timing import Cron, Every, Minutes, parse_schedule
from sqla_queue.maintenance import ManualClock, PurgeRoutine
from sqla_queue.maintenance.lock import routine_lock_for
from sqla_queue.policies.leases import Heartbeat
from sqla_queue.worker import Runner
from tests.acceptance.test_concurrency import insert_tasks, spawned, statuses, worker_env
from tests.conftest import ROOT, run_cli, wait_until
from tests.integration.test_worker import drain, effects, enqueue, tasks
from tests.support.app import App, build
from tests.support.servers import PrivateMariaDB

UTC = dt.timezone.utc


def runner(worker: type[WorkerBase], engine: Engine, clock: Any = None, **env: str) -> Runner:
    return Runner.for_worker(worker(), engine=engine, settings=Settings.from_env(env), clock=clock)


def age_rows(engine: Engine, app: App, days: float, *ids: int) -> None:
    """Move rows' data_hora back (as if they ran ``days`` ago)."""
    when = utcnow() - dt.timedelta(days=days)
    with engine.begin() as conn:
        statement = update(app.Task).values(data_hora=when)
        if ids:
            statement = statement.where(app.Task.id.in_(ids))
        conn.execute(statement)


# ------------------------------------------------------------------ schedules
def test_minute_list_fires_once_in_each_listed_minute() -> None:
    minutes = parse_schedule("0,30", "QUEUE_MINUTE_PURGE_THREAD")
    assert minutes == Minutes((0, 30))
    at = dt.datetime(2030, 1, 1, 10, 29, 59, tzinfo=UTC)
    assert minutes.next_after(at) == at.replace(minute=30, second=0)
    assert minutes.next_after(at.replace(minute=30, second=0)) == at.replace(
        hour=11, minute=0, second=0
    )
    assert minutes.slot_at(at) == at.replace(minute=0, second=0)
    assert minutes.slot_at(at.replace(minute=5)) == at.replace(minute=0, second=0)
    assert minutes.slot_at(at.replace(hour=10, minute=0, second=0)) == at.replace(
        minute=0, second=0
    )


def test_cron_and_every_schedules() -> None:
    cron = parse_schedule("*/7 * * * *", "SQLA_QUEUE_RESCUE_CRON")
    assert cron == Cron("*/7 * * * *")
    at = dt.datetime(2030, 1, 1, 0, 7, 0, tzinfo=UTC)
    assert cron.slot_at(at) == at
    assert cron.next_after(at) == at.replace(minute=14)
    every = parse_schedule("@every 15s", "x")
    assert every == Every(15)
    assert every.slot_at(at.replace(second=29)) == at.replace(second=15)
    assert every.next_after(at.replace(second=29)) == at.replace(second=30)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "0,60",
            "QUEUE_MINUTE_RETRY_THREAD must list minutes from 0 to 59 (the seed's form)",
        ),
        (
            "*/7 * *",
            "QUEUE_MINUTE_RETRY_THREAD is not a valid cron string (Wrong number of fields)",
        ),
        (
            "61 * * * *",
            "QUEUE_MINUTE_RETRY_THREAD is not a valid cron string (Bad minute): '61 * * * *'",
        ),
        ("@every 0s", "QUEUE_MINUTE_RETRY_THREAD must be @every 0.5s to @every 24h"),
        ("@every 2000h", "QUEUE_MINUTE_RETRY_THREAD must be @every 0.5s to @every 24h"),
        ("@hourly", "QUEUE_MINUTE_RETRY_THREAD must be @every N followed by s, m or h"),
    ],
)
def test_bad_schedules_are_refused_with_the_variable_name(text: str, message: str) -> None:
    with pytest.raises(Exception) as info:
        Settings.from_env({"QUEUE_MINUTE_RETRY_THREAD": text})
    assert str(info.value).startswith(message)


# ------------------------------------------------------------------ the lock
def test_routine_lock_is_exclusive_namespaced_and_freed(engine: Engine, app: App) -> None:
    first = runner(app.RecordingWorker, engine)
    second = runner(app.RecordingWorker, engine)
    a, b = first.app.routine_lock(), second.app.routine_lock()
    try:
        assert a.try_acquire("purge")
        assert a.try_acquire("purge")  # re-entrant for its holder
        assert not b.try_acquire("purge")
        assert b.try_acquire("rescue")  # another routine, another lock
        a.release("purge")
        assert b.try_acquire("purge")
    finally:
        for lock in (a, b):
            lock.close()  # type: ignore[attr-defined]
    # another queue table shares nothing
    held = routine_lock_for(engine, first.adapter)
    other = routine_lock_for(engine, _other_table_adapter(first))
    try:
        assert held.try_acquire("purge")
        assert other.try_acquire("purge")
    finally:
        held.close()  # type: ignore[attr-defined]
        other.close()  # type: ignore[attr-defined]


def _other_table_adapter(worker: Runner) -> Any:
    from sqla_queue.adapters import adapter_for
    from sqla_queue.client.queue import resolve_table

    table = resolve_table("fila_sqlaq_other_lock")
    return adapter_for(worker.engine.dialect, table, table.name)


# ------------------------------------------------------------------ the race
SCHEDULES = {
    "SQLA_QUEUE_RESCUE_CRON": "* * * * *",
    "SQLA_QUEUE_SCHEDULE_CRON": "* * * * *",
    "SQLA_QUEUE_PURGE_CRON": "* * * * *",
    "SQLA_QUEUE_TTL_CRON": "* * * * *",
    "SQLA_QUEUE_VACUUM_CRON": "* * * * *",
    "SQLA_QUEUE_ITEM_TTL": "60",
}


def test_four_workers_racing_run_each_routine_once_per_slot(engine: Engine, app: App) -> None:
    clock = ManualClock(dt.datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC))
    workers = [runner(app.RecordingWorker, engine, clock, **SCHEDULES) for _ in range(4)]
    for worker in workers:
        worker.maintenance.start()
    slots = []
    try:
        for _ in range(3):
            slot = clock.advance(60).replace(second=0)
            slots.append(slot)
            for name in SCHEDULES_ROUTINES:
                wait_until(
                    lambda name=name, slot=slot: all(
                        w.maintenance.considered(name) == slot for w in workers
                    ),
                    message=f"every worker to reach {name}'s slot {slot}",
                )
    finally:
        for worker in workers:
            worker.maintenance.stop()
    runs = Counter((run.routine, run.slot) for w in workers for run in w.maintenance.history)
    assert runs == Counter({(name, slot): 1 for name in SCHEDULES_ROUTINES for slot in slots})
    assert all(run.result.error is None for w in workers for run in w.maintenance.history)


SCHEDULES_ROUTINES = ("rescue", "schedule", "purge", "ttl", "vacuum")


# ------------------------------------------------------------------ rescue
def test_heartbeating_handler_past_its_lease_is_kept_and_a_frozen_one_rescued(
    engine: Engine, app: App, installed: None
) -> None:
    # A rescue that follows a heartbeat must see the lease alive: the lease
    # is the slack for the test thread's scheduling (1 s flaked under CI's
    # load), and four beats outlast it.
    class Short(app.RecordingWorker):  # type: ignore[name-defined,misc]
        lease_seconds = 2.0

    [task_id] = enqueue(engine, app, {"n": 1})
    holder, rescuer = runner(Short, engine), runner(Short, engine)
    rescue = rescuer.maintenance.routine("rescue")
    heartbeat = Heartbeat(engine, holder.adapter, holder.app.claims, holder.app.lease)
    with holder.adapter.connect_claim(engine) as claim:
        assert len(holder.manager.claim(claim, limit=1)) == 1
        heartbeat.start()
        try:
            for _ in range(4):  # more than a lease's worth of heartbeats
                heartbeat.beat.clear()
                assert heartbeat.beat.wait(timeout=5), "no heartbeat"
                assert rescue.run_once().counts == {"rescued": 0}
        finally:
            heartbeat.stop()  # the process freezes: its connection lives, its heartbeat not
        wait_until(
            lambda: rescue.run_once().counts["rescued"] == 1,
            message="the frozen task's lease to run out",
        )
    lost, retry = tasks(engine, app)
    assert (lost.id, lost.status) == (task_id, "falha_processando")
    assert (retry.initial_id, retry.attempt, retry.status) == (task_id, 2, "pendente")


def test_sigkilled_worker_task_is_rescued_and_completed_by_another_once(
    engine: Engine, app: App, db_url: str, table_name: str, tmp_path: Path
) -> None:
    """Worker A dies mid-task; worker B rescues the task and runs it, once.
    On PostgreSQL and MariaDB, B runs all along and its *scheduled* rescue
    sees A's lock die. On SQLite A's batch holds the database's write lock
    while its handler runs, so B starts after the kill: the task is rescued
    once its one-second lease has run out."""
    env = worker_env(
        table_name,
        SQLA_QUEUE_TEST_SIGNAL_DIR=str(tmp_path),
        SQLA_QUEUE_TEST_LEASE="1",
        SQLA_QUEUE_RESCUE_CRON="@every 1s",
    )
    sqlite = db_url.startswith("sqlite")
    [task_id] = insert_tasks(engine, app, 1)
    warm_up: list[int] = []
    with spawned("worker", "tests.support.app:BlockingWorker", "--url", db_url, env=env) as [a]:
        wait_until(lambda: (tmp_path / f"started-{task_id}").exists(), message="A to start it")
        if sqlite:
            a.proc.send_signal(signal.SIGKILL)
        with spawned("worker", "tests.support.app:RecordingWorker", "--url", db_url, env=env) as [
            b
        ]:
            if not sqlite:
                # B's lane ran its start-up rescue before this (A was alive then)
                warm_up = insert_tasks(engine, app, 1, process="warm-up")
                wait_until(lambda: statuses(engine, app)[warm_up[0]] == "sucesso", message="B")
                a.proc.send_signal(signal.SIGKILL)
            assert a.wait(timeout=30) == -signal.SIGKILL
            wait_until(
                lambda: "sucesso" in {t.status for t in tasks(engine, app) if t.initial_id},
                timeout=60,
                message="B to rescue and run the task",
            )
            b.proc.send_signal(signal.SIGTERM)
            assert b.wait(timeout=30) == 0, b.output
    if not sqlite:
        assert "maintenance rescue: rescued 1" in b.output
    [lost] = [t for t in tasks(engine, app) if t.id == task_id]
    [retry] = [t for t in tasks(engine, app) if t.initial_id == task_id]
    assert lost.status == "falha_processando"
    assert retry.status == "sucesso"
    assert [e for e in effects(engine, app) if e[1] == task_id] == [(retry.id, task_id, "{'n': 0}")]


# ------------------------------------------------------------------ schedule
def test_schedule_promotes_due_tasks_and_wakes_the_lanes(
    engine: Engine, app: App, installed: None
) -> None:
    past = utcnow() - dt.timedelta(minutes=1)
    future = utcnow() + dt.timedelta(hours=1)
    due = enqueue(engine, app, {"n": 1}, {"n": 2}, status="agendada", run_at=past)
    later = enqueue(engine, app, {"n": 3}, status="agendada", run_at=future)
    worker = runner(app.RecordingWorker, engine)
    worker.wake.clear()
    result = worker.maintenance.run_now("schedule")
    assert result.counts == {"promoted": 2, "renotified": 0}
    assert worker.wake.is_set()
    status = statuses(engine, app)
    assert [status[i] for i in due + later] == ["pendente", "pendente", "agendada"]


def test_schedule_renotifies_a_pendente_task_older_than_the_wait_interval(
    engine: Engine, app: App, installed: None
) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    clock = ManualClock(utcnow())
    worker = runner(app.RecordingWorker, engine, clock)
    assert worker.maintenance.run_now("schedule").counts["renotified"] == 0
    clock.advance(6)  # past QUEUE_WAIT_NOTIFY_INTERVAL's 5 s
    worker.wake.clear()
    assert worker.maintenance.run_now("schedule").counts["renotified"] == 1
    assert worker.wake.is_set()
    assert statuses(engine, app) == {task_id: "pendente"}


# ------------------------------------------------------------------ purge
def _chains(engine: Engine, app: App) -> dict[int, list[tuple[int, bool, str]]]:
    chains: dict[int, list[tuple[int, bool, str]]] = {}
    for task in tasks(engine, app):
        key = task.live_id if task.dead else (task.initial_id or task.id)
        chains.setdefault(key, []).append((task.id, task.dead, task.status))
    return chains


@pytest.fixture
def purge_scene(engine: Engine, app: App, installed: None) -> dict[str, int]:
    """Old: a finished chain of one row, a failed chain with its retries and
    dead-letter run; an open chain (a retry still pendente); a recent one."""

    class Failing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

    [done] = enqueue(engine, app, {"n": 1})
    [dead] = enqueue(engine, app, {"fail": "always"})
    drain(Failing, engine)
    [open_] = enqueue(engine, app, {"fail": "once"})
    with engine.begin() as conn:  # a failed first attempt whose retry waits
        conn.execute(update(app.Task).where(app.Task.id == open_).values(status="falha"))
        conn.execute(
            app.Task.__table__.insert().values(
                id_inicial=open_, tentativa=2, status="pendente", processo="faturar"
            )
        )
    age_rows(engine, app, 70)
    [recent] = enqueue(engine, app, {"n": 4})
    with engine.begin() as conn:
        conn.execute(update(app.Task).where(app.Task.id == recent).values(status="sucesso"))
    return {"done": done, "dead": dead, "open": open_, "recent": recent}


def test_purge_deletes_whole_old_chains_and_keeps_open_and_recent_ones(
    engine: Engine, app: App, purge_scene: dict[str, int]
) -> None:
    before = _chains(engine, app)
    assert len(before[purge_scene["dead"]]) == 3  # two attempts and the dead-letter run
    seen: list[tuple[str, list[int], int]] = []

    def archive(conn: Connection, table: Table, chain_ids: Sequence[int]) -> None:
        # in the chunk's transaction, before its DELETE: the rows are all there
        count = conn.execute(select(func.count()).select_from(table)).scalar_one()
        seen.append((table.name, sorted(chain_ids), count))

    worker = runner(app.RecordingWorker, engine, QUEUE_PURGE_LIMIT="2")
    routine = worker.maintenance.routine("purge")
    assert isinstance(routine, PurgeRoutine)
    dry = routine.run_once(dry_run=True)
    kept = {"chains": 2, "rows": 4, "chunks": 2, "open_chains_kept": 1}
    assert dry.counts == {**kept, "workflows": 0, "workflow_rows": 0}
    assert _chains(engine, app) == before
    routine.config = dataclasses.replace(routine.config, before_delete=archive)
    result = routine.run_once()
    assert result.counts == {**kept, "workflows": 0, "workflow_rows": 0}
    name = app.Task.__tablename__
    assert seen == [(name, [purge_scene["done"]], 7), (name, [purge_scene["dead"]], 6)]
    assert set(_chains(engine, app)) == {purge_scene["open"], purge_scene["recent"]}


def test_purge_hook_that_raises_deletes_nothing_of_its_chunk_and_says_so(
    engine: Engine, app: App, purge_scene: dict[str, int]
) -> None:
    before = _chains(engine, app)

    def broken(conn: Connection, table: Table, chain_ids: Sequence[int]) -> None:
        raise OSError("archive disk full")

    worker = runner(app.RecordingWorker, engine)
    routine = worker.maintenance.routine("purge")
    assert isinstance(routine, PurgeRoutine)
    routine.config = dataclasses.replace(routine.config, before_delete=broken)
    result = routine.run_once()
    assert result.error == "OSError: archive disk full"
    assert result.counts["rows"] == 0
    assert _chains(engine, app) == before


def _purge_everything(engine: Engine, app: App) -> int:
    """Finish and age every row, then run the real purge: rows deleted."""
    with engine.begin() as conn:
        conn.execute(update(app.Task).values(status="sucesso"))
    age_rows(engine, app, 70)
    result = runner(app.RecordingWorker, engine).maintenance.routine("purge").run_once()
    assert result.error is None
    return int(result.counts["rows"])


def test_a_task_enqueued_after_the_purge_never_gets_a_purged_tasks_id(
    engine: Engine, app: App, installed: None
) -> None:
    """The purge deleted the newest rows: a new task must still get a new id
    (and so a new chain_id), or a handler idempotent on chain_id, or a
    webhook receiver deduplicating on webhook-id, drops its work."""
    given = enqueue(engine, app, {"n": 1}, {"n": 2}, {"n": 3})
    assert _purge_everything(engine, app) == 3
    assert tasks(engine, app) == []
    again = enqueue(engine, app, {"n": 4}, {"n": 5})
    assert min(again) > max(given)
    given += again
    with engine.begin() as conn:  # the newest row alone, as the purge deletes it
        conn.execute(delete(app.Task).where(app.Task.id == max(given)))
    [last] = enqueue(engine, app, {"n": 6})
    assert last > max(given)


def test_mariadb_gives_no_deleted_id_again_after_a_restart(
    private_mariadb: PrivateMariaDB, table_name: str, installed: None
) -> None:
    """InnoDB keeps its auto-increment counter across a restart (MariaDB
    10.2.4+): the newest rows deleted, the server restarted, the next id is
    still above every id given."""
    app = build(table_name)
    engine = create_engine(private_mariadb.url)
    try:
        app.Base.metadata.create_all(engine)
        given = enqueue(engine, app, *({"n": n} for n in range(5)))
        with engine.begin() as conn:
            conn.execute(delete(app.Task).where(app.Task.id.in_(given[2:])))
        engine.dispose()
        private_mariadb.restart()
        [after] = enqueue(engine, app, {"n": 5})
        assert after > max(given)
    finally:
        engine.dispose()


def test_purge_keeps_a_requeued_chain_while_its_dead_task_stays_so_it_is_requeued_once(
    engine: Engine, app: App, installed: None
) -> None:
    """dead_letter_retention (30 days) longer than QUEUE_PURGE_MAX_AGE (1 day):
    the chain requeued from a dead task is kept as long as the dead-letter run
    (the evidence that it was requeued), then deleted with it."""

    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    class Healed(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            return super().execute({"n": payload["n"]}, task, session)

    [task_id] = enqueue(engine, app, {"fail": "until requeued", "n": 1})
    drain(Once, engine)
    with Session(engine) as session, session.begin():
        [revived] = QueueClient(session, app.Task).requeue_dead(all_dead=True)
    drain(Healed, engine)
    assert [(t.dead, t.status) for t in tasks(engine, app)] == [
        (False, "falha"),
        (True, "sucesso"),
        (False, "sucesso"),
    ]
    clock = ManualClock(utcnow() + dt.timedelta(days=2))
    worker = runner(
        app.RecordingWorker,
        engine,
        clock,
        QUEUE_PURGE_MAX_AGE="1",
        SQLA_QUEUE_DEAD_LETTER_RETENTION="30",
    )
    purge = worker.maintenance.routine("purge")
    purge.run_once()  # the revived chain is older than 1 day, the dead-letter run than 30 not
    with Session(engine) as session, session.begin():
        assert QueueClient(session, app.Task).requeue_dead(all_dead=True) == []
    assert len(tasks(engine, app)) == 3  # the purge kept the revived chain with the dead one
    drain(Healed, engine)
    revived_effects = [note for _, chain, note in effects(engine, app) if chain == revived.new_id]
    assert revived_effects == ["{'n': 1}"]
    clock.advance(dt.timedelta(days=30))  # past dead_letter_retention: the whole family goes
    assert purge.run_once().counts == {
        "chains": 1,
        "rows": 3,
        "chunks": 1,
        "open_chains_kept": 0,
        "workflows": 0,
        "workflow_rows": 0,
    }
    assert tasks(engine, app) == []
    assert task_id == revived.live_id


# ------------------------------------------------------------------ ttl
def test_ttl_sends_a_task_pending_too_long_to_the_dead_letter(
    engine: Engine, app: App, installed: None
) -> None:
    old, fresh = enqueue(engine, app, {"n": 1}, {"n": 2})
    age_rows(engine, app, 0.5, old)  # 12 hours
    worker = runner(app.RecordingWorker, engine, SQLA_QUEUE_ITEM_TTL="60")
    result = worker.maintenance.run_now("ttl")
    assert result.counts == {"expired": 1, "dead_letters": 1}
    expired, kept, dead = tasks(engine, app)
    assert (expired.id, expired.status, expired.retries_exhausted) == (old, "falha", True)
    assert expired.message == (
        "Tarefa expirada: pendente há mais de 60 minutos (item_ttl). Enviada à fila de mortos."
    )
    assert (kept.id, kept.status) == (fresh, "pendente")
    assert (dead.dead, dead.live_id, dead.payload, dead.status) == (True, old, {"n": 1}, "pendente")
    drain(app.RecordingWorker, engine)
    assert sorted(note for _, _, note in effects(engine, app)) == ["dead", "{'n': 2}"]


# ------------------------------------------------------------------ the command
@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)  # the routines run on all three
def test_maintenance_run_command_prints_what_it_did(
    engine: Engine, app: App, db_url: str, table_name: str, installed: None
) -> None:
    [old] = enqueue(engine, app, {"n": 1})
    with engine.begin() as conn:
        conn.execute(update(app.Task).values(status="sucesso"))
    age_rows(engine, app, 90, old)
    env = worker_env(table_name)
    dry = run_cli(
        "maintenance",
        "run",
        "purge",
        "tests.support.app:RecordingWorker",
        "--url",
        db_url,
        "--dry-run",
        env=env,
    )
    assert dry.stdout.startswith(
        "purge (dry run): chains 1, rows 1, chunks 1, open chains kept 0, workflows 0, "
        "workflow rows 0 in "
    )
    assert statuses(engine, app) == {old: "sucesso"}
    done = run_cli(
        "maintenance", "run", "purge", "tests.support.app:RecordingWorker", "--url", db_url, env=env
    )
    assert done.stdout.startswith(
        "purge: chains 1, rows 1, chunks 1, open chains kept 0, workflows 0, workflow rows 0 in "
    )
    assert statuses(engine, app) == {}
    bad = run_cli(
        "maintenance", "run", "compact", "tests.support.app:RecordingWorker", env=env, check=False
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[str, str, int]:
    """Run the CLI with standard error on a pseudo-terminal: (stdout, what
    the terminal got, exit code)."""
    leader, follower = pty.openpty()
    drawn: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed
                return
            if not data:
                return
            drawn.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqla_queue.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        os.close(follower)
        follower = -1
        out, _ = proc.communicate(timeout=120)
        reader.join(timeout=30)
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    return out, b"".join(drawn).decode(errors="replace"), proc.returncode


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_long_routine_draws_a_progress_bar_on_a_terminal_and_not_in_a_pipe(
    engine: Engine, app: App, db_url: str, table_name: str, installed: None
) -> None:
    def finished_and_old(count: int) -> None:
        enqueue(engine, app, *({"n": n} for n in range(count)))
        with engine.begin() as conn:
            conn.execute(update(app.Task).values(status="sucesso"))
        age_rows(engine, app, 90)

    args = ["maintenance", "run", "purge", "tests.support.app:RecordingWorker", "--url", db_url]
    # 40 chunks of 5 rows, each its own transaction: a bar to draw
    env = {
        **os.environ,
        **worker_env(table_name),
        "QUEUE_PURGE_LIMIT": "5",
        "TERM": "xterm-256color",
        "COLUMNS": "120",
    }
    env.pop("NO_COLOR", None)
    finished_and_old(200)
    out, drawn, code = _on_a_terminal(args, env)
    assert code == 0, drawn
    assert out.startswith(
        "purge: chains 200, rows 200, chunks 40, open chains kept 0, workflows 0, "
        "workflow rows 0 in "
    )
    assert "purge" in drawn and "rows 200" in drawn and "━" in drawn  # the bar and its counts
    assert statuses(engine, app) == {}

    finished_and_old(200)
    piped = run_cli(*args, env=env)
    assert piped.stdout.startswith("purge: chains 200, rows 200, chunks 40, ")
    assert "━" not in piped.stderr and "\x1b[" not in piped.stderr and "rows" not in piped.stderr
