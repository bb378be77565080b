"""The operator's view: counts of tasks (not attempts), timelines, cancel
and retry-now, on every database.

Every count is checked against the same count computed in SQL from the
definitions (docs/operations.md) by another route: a chain's newest attempt
is its row with the largest id (the implementation reads the
``reenfileirado`` flag instead), on tables with retries, a rescue, dead
letters (one requeued), cancellations and pub/sub copies.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import unicodedata
from typing import Any

import pytest
from sqlalchemy import Engine, Table, false, func, select, true, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, TaskNotFoundError, TaskStateError
from sqla_queue.adapters import adapter_for
from sqla_queue.adapters.locks import routine_key
from sqla_queue.client.pause import pause, resume
from sqla_queue.common.redaction import escape_controls, escape_json_line
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.maintenance import routine_lock_for
from sqla_queue.ops.status import STATES, message_gloss, queue_status, task_timeline
from sqla_queue.schema.mixins import channel_of
from sqla_queue.testing import run_until_empty
from sqla_queue.worker import Runner
from tests.conftest import wait_until
from tests.support.app import App

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------ the reference
CANCELLED = "Tarefa cancelada pelo operador."


def _state(status: str | None, attempt: int | None, message: str | None) -> str:
    later = (attempt or 1) > 1
    if status == "falha" and message == CANCELLED:
        return "cancelled"
    return {
        "pendente": "retrying" if later else "ready",
        "agendada": "retrying" if later else "scheduled",
        "processando": "running",
        "sucesso": "succeeded",
        "falha": "failed",
        "falha_processando": "failed",
    }[status or ""]


def counts_by_definition(engine: Engine, table: Table) -> dict[str, dict[str, int]]:
    """{process: {state: n}} from the definitions: a chain is the rows
    sharing COALESCE(id_inicial, id) with dead false, in the state of its
    newest (largest id) row (cancelled: a falha with the cancellation's
    message); dead_letter counts rows with dead true and no id_inicial."""
    c = table.c
    chain = func.coalesce(c.id_inicial, c.id)
    newest = (
        select(func.max(c.id).label("newest")).where(c.dead == false()).group_by(chain).subquery()
    )
    found: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for process, status, attempt, message in conn.execute(
            select(c.processo, c.status, c.tentativa, c.mensagem).join(
                newest, c.id == newest.c.newest
            )
        ):
            by = found.setdefault(process or "", dict.fromkeys(STATES, 0))
            by[_state(status, attempt, message)] += 1
        for process, n in conn.execute(
            select(c.processo, func.count())
            .where(c.dead == true(), c.id_inicial.is_(None))
            .group_by(c.processo)
        ):
            found.setdefault(process or "", dict.fromkeys(STATES, 0))["dead_letter"] += n
    return dict(sorted(found.items()))


def totals_of(processes: dict[str, dict[str, int]]) -> dict[str, int]:
    return {state: sum(by[state] for by in processes.values()) for state in STATES}


# ------------------------------------------------------------ the scenario
def runner(worker: type, engine: Engine) -> Runner:
    return Runner.for_worker(worker(), engine=engine, settings=Settings())


def build_history(engine: Engine, app: App) -> dict[str, int]:
    """A queue with every state: successes, an exhausted chain with its
    dead-letter run (requeued once), a retry waiting out its backoff, a
    scheduled task, ready tasks with a tenant, a running task, a rescued
    one and a cancelled one. Returns some of their ids."""

    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"faturar"})
        max_retry = 2

    class Slow(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"lento"})
        retry_interval_minutes = 30

    class Backoff(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"backoff"})
        retry_interval_minutes = 30

    ids: dict[str, int] = {}
    with Session(engine) as session:
        session.add_all([app.Task(process="faturar", payload={"n": n}) for n in range(3)])
        exhausted = app.Task(process="faturar", payload={"fail": "always"})
        waiting = app.Task(process="backoff", payload={"fail": "once"})
        later = app.Task(
            process="relatorio", payload={"n": 9}, run_at=utcnow() + dt.timedelta(days=1)
        )
        ready = [app.Task(process="relatorio", payload={"n": n}, tenant=7) for n in range(3)]
        session.add_all([exhausted, waiting, later, *ready])
        session.flush()
        ids.update(exhausted=exhausted.id, waiting=waiting.id, later=later.id, ready=ready[0].id)
        assert run_until_empty(Billing, session).dead == 1
        assert run_until_empty(Backoff, session).failed == 1
        session.commit()
    # the dead task requeued: a new chain, ready, linked to the old one
    with Session(engine) as session:
        [requeued] = QueueClient(session, app.Task).requeue_dead([ids["exhausted"]])
        ids["requeued"] = requeued.new_id
        # one ready task cancelled
        QueueClient(session, app.Task).cancel(ids["ready"])
        session.add_all([app.Task(process="lento", payload={"n": n}) for n in range(2)])
        session.commit()
    # two tasks claimed by a worker: one keeps running, the other's worker
    # "dies" (its lease runs out) and the rescue fails it and retries it
    slow = runner(Slow, engine)
    with slow.adapter.connect_claim(engine) as claim:
        claimed = slow.manager.claim(claim, limit=2)
    assert len(claimed) == 2
    ids["running"], ids["rescued"] = claimed[0].id, claimed[1].id
    with engine.begin() as conn:
        conn.execute(
            update(app.Task)
            .where(app.Task.id == ids["rescued"])
            .values(lease_expires_at=utcnow() - dt.timedelta(hours=1))
        )
    with slow.adapter.connect_maintenance(engine) as conn:
        assert slow.manager.rescue(conn) == 1
    return ids


EXPECTED = {
    # 3 successes; the exhausted chain failed, its dead-letter run, and the
    # chain requeued from it (ready)
    "faturar": {"succeeded": 3, "failed": 1, "dead_letter": 1, "ready": 1},
    "backoff": {"retrying": 1},
    # one scheduled a day ahead, 3 ready of which one cancelled
    "relatorio": {"scheduled": 1, "ready": 2, "cancelled": 1},
    # one running, one rescued and waiting for its retry
    "lento": {"running": 1, "retrying": 1},
}


def test_status_counts_tasks_not_attempts_as_the_definitions_say(
    engine: Engine, app: App, installed: None
) -> None:
    build_history(engine, app)
    reference = counts_by_definition(engine, app.Task.__table__)
    expected = {
        name: {state: EXPECTED[name].get(state, 0) for state in STATES} for name in sorted(EXPECTED)
    }
    assert reference == expected  # the scenario is what it says

    status = queue_status(engine, app.Task)
    data = status.as_json()
    assert data["processes"] == reference
    assert data["totals"] == totals_of(reference)
    assert data["queue"] == app.Task.__tablename__
    assert data["tenants"] == {
        "7": {
            "totals": {**dict.fromkeys(STATES, 0), "ready": 2, "cancelled": 1},
            "processes": {"relatorio": {**dict.fromkeys(STATES, 0), "ready": 2, "cancelled": 1}},
        }
    }
    assert data["oldest_ready_seconds"] is not None and data["oldest_ready_seconds"] >= 0
    assert [item.process for item in status.running] == ["lento"]
    # the newest failures: the rescue's, the cancellation, the exhausted chain's
    messages = [failure.message or "" for failure in status.failures]
    assert any("abortado repentinamente" in m for m in messages)
    assert any(m == "Tarefa cancelada pelo operador." for m in messages)
    assert any("Máximo de tentativas atingido" in m for m in messages)
    # every attempt finished in the last 5 minutes: 3 + 2 + 1 dead-letter
    # run + 1 backoff failure + the cancellation + the rescued one; the
    # dead-letter run succeeded
    t = status.throughput
    assert (t.finished, t.succeeded, t.failed, t.cancelled) == (9, 4, 4, 1)
    assert t.failure_rate == 4 / 8
    # from a Session and a Connection too, the same counts
    with Session(engine) as session:
        assert queue_status(session, app.Task).as_json()["processes"] == reference
    with engine.connect() as conn:
        assert queue_status(conn, app.Task.__tablename__).as_json()["totals"] == totals_of(
            reference
        )


def test_pubsub_copies_are_counted_as_their_own_tasks(
    pengine: Engine, papp: Any, installed: None
) -> None:
    with Session(pengine) as session:
        session.add_all(
            [
                papp.Subscriber(id="ok", process="pedido"),
                papp.Subscriber(id="fails", process="pedido"),
            ]
        )
        session.commit()
        client = QueueClient(session, papp.Task)
        publication = client.insert_task_pub_sub("erp", "x", "pedido", "1", {"pedido": 1})
        session.commit()
        run_until_empty(papp.PubSubWorker, session)
        session.commit()
    reference = counts_by_definition(pengine, papp.Task.__table__)
    # the publication succeeded; its "ok" copy succeeded; its "fails" copy
    # spent its 2 attempts and ran its dead-letter run
    assert totals_of(reference) == {
        **dict.fromkeys(STATES, 0),
        "succeeded": 2,
        "failed": 1,
        "dead_letter": 1,
    }
    assert queue_status(pengine, papp.Task).as_json()["processes"] == reference

    timeline = task_timeline(pengine, papp.Task, publication)
    assert timeline.state == "succeeded"
    copies = timeline.of_kind("copy")
    assert sorted({row.subscriber_id for row in copies}) == ["fails", "ok"]
    # ok's one attempt; fails' two and its dead-letter run
    assert [(row.subscriber_id, row.dead) for row in copies] == [
        ("ok", False),
        ("fails", False),
        ("fails", False),
        ("fails", True),
    ] or sorted((row.subscriber_id or "", row.dead) for row in copies) == [
        ("fails", False),
        ("fails", False),
        ("fails", True),
        ("ok", False),
    ]


def test_timeline_shows_every_attempt_the_dead_letter_run_and_the_requeued_chain(
    engine: Engine, app: App, installed: None
) -> None:
    ids = build_history(engine, app)
    # any of the family's ids gives the same timeline; its state is that of
    # the chain the id belongs to: the task's own, or the requeued one's
    for task_id, state in ((ids["exhausted"], "failed"), (ids["requeued"], "ready")):
        timeline = task_timeline(engine, app.Task, task_id)
        assert timeline.chain_id == ids["exhausted"]
        assert timeline.state == state
        assert timeline.requeued == {ids["requeued"]: "ready"}
        kinds = [(row.kind, row.attempt, row.status, row.state) for row in timeline.rows]
        assert kinds == [
            ("attempt", 1, "falha", "retried"),
            ("attempt", 2, "falha", "failed"),
            ("dead_letter", 1, "sucesso", "succeeded"),
            ("requeued", 1, "pendente", "ready"),
        ]
        assert "Máximo de tentativas" in (timeline.rows[1].message or "")
        assert all(row.worker_id for row in timeline.rows[:3])
    rescued = task_timeline(engine, app.Task, ids["rescued"])
    assert [(row.status, row.attempt) for row in rescued.rows] == [
        ("falha_processando", 1),
        ("agendada", 2),
    ]
    assert rescued.state == "retrying"
    with pytest.raises(TaskNotFoundError, match="no task 987654321"):
        task_timeline(engine, app.Task, 987654321)


# ------------------------------------------------------------ English states
def english_history(engine: Engine, app: App) -> dict[str, int]:
    """build_history's queue, and: a task that failed once then succeeded
    on its retry ("flaky"), and the chain requeued from the dead letter
    claimed by a worker (running)."""
    ids = build_history(engine, app)

    class Flaky(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"flaky"})

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if task.attempt == 1:
                raise RuntimeError("first attempt fails")
            return None

    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"faturar"})

    with Session(engine) as session:
        flaky = app.Task(process="flaky", payload={"n": 1})
        session.add(flaky)
        session.flush()
        ids["flaky"] = flaky.id
        outcome = run_until_empty(Flaky, session)
        assert (outcome.succeeded, outcome.failed) == (1, 1)
        session.commit()
    billing = runner(Billing, engine)
    with billing.adapter.connect_claim(engine) as claim:
        assert [task.id for task in billing.manager.claim(claim, limit=1)] == [ids["requeued"]]
    return ids


STORED = {"pendente", "agendada", "processando", "sucesso", "falha", "falha_processando"}


def test_timeline_says_in_english_what_became_of_each_attempt(
    engine: Engine, app: App, installed: None
) -> None:
    ids = english_history(engine, app)

    def seen(task_id: int) -> tuple[str, list[tuple[str | None, str | None, str]]]:
        timeline = task_timeline(engine, app.Task, task_id)
        return timeline.state, [(row.status, row.state, row.label) for row in timeline.rows]

    # a retry then a success
    assert seen(ids["flaky"]) == (
        "succeeded",
        [("falha", "retried", "retried"), ("sucesso", "succeeded", "succeeded")],
    )
    flaky = task_timeline(engine, app.Task, ids["flaky"])
    assert message_gloss(flaky.rows[0].message) == "retry enqueued"
    assert (flaky.rows[0].message or "").endswith("Tarefa reenfileirada.")  # as stored
    # a cancelled task
    assert seen(ids["ready"]) == ("cancelled", [("falha", "cancelled", "cancelled")])
    # the exhausted task: its dead-letter run never reads as a bare success;
    # the chain requeued from it runs
    assert seen(ids["exhausted"]) == (
        "failed",
        [
            ("falha", "retried", "retried"),
            ("falha", "failed", "failed"),
            ("sucesso", "succeeded", "dead-letter run succeeded"),
            ("processando", "running", "running"),
        ],
    )
    exhausted = task_timeline(engine, app.Task, ids["exhausted"])
    assert exhausted.requeued == {ids["requeued"]: "running"}
    assert message_gloss(exhausted.rows[1].message) == "maximum attempts reached"
    # asked by the requeued chain's id: its own state, running
    requeued = task_timeline(engine, app.Task, ids["requeued"])
    assert (requeued.state, requeued.chain_id, requeued.own_chain_id) == (
        "running",
        ids["exhausted"],
        ids["requeued"],
    )
    # asked by the dead-letter run's id: the dead-letter run's chain
    dead = next(row.id for row in exhausted.rows if row.kind == "dead_letter")
    assert task_timeline(engine, app.Task, dead).state == "dead_letter"
    # a rescued attempt, its retry waiting out its backoff
    assert seen(ids["rescued"]) == (
        "retrying",
        [("falha_processando", "rescued", "rescued"), ("agendada", "scheduled", "scheduled")],
    )
    rescued = task_timeline(engine, app.Task, ids["rescued"])
    assert message_gloss(rescued.rows[0].message) == (
        "unknown processing failure (the processing stopped suddenly); retry enqueued"
    )
    # the JSON keeps the stored status and adds the English state beside it
    data = exhausted.as_json()
    assert [(row["status"], row["state"]) for row in data["rows"]] == [
        ("falha", "retried"),
        ("falha", "failed"),
        ("sucesso", "succeeded"),
        ("processando", "running"),
    ]
    assert data["requeued"] == [{"chain_id": ids["requeued"], "state": "running"}]
    assert json.loads(json.dumps(data)) == data


def test_the_oldest_ready_task_leaves_out_paused_processes(
    engine: Engine, app: App, installed: None
) -> None:
    now = utcnow()
    with Session(engine) as session:
        session.add_all(
            [
                app.Task(process="parado", payload={"n": 1}, run_at=now - dt.timedelta(hours=2)),
                app.Task(process="ativo", payload={"n": 2}, run_at=now - dt.timedelta(minutes=10)),
            ]
        )
        session.commit()
    status = queue_status(engine, app.Task, now=now)
    assert 7100 < (status.oldest_ready_seconds or 0) < 7300
    assert status.oldest_ready_paused_left_out == 0
    with engine.begin() as conn:
        pause(conn, app.Task, ["parado"])
    status = queue_status(engine, app.Task, now=now)
    # the paused process's task is still counted as ready, not as the oldest
    assert status.processes["parado"].ready == 1
    assert 500 < (status.oldest_ready_seconds or 0) < 700
    assert status.oldest_ready_paused_left_out == 1
    assert status.as_json()["oldest_ready_paused_left_out"] == 1
    with engine.begin() as conn:
        pause(conn, app.Task, ["ativo"])
    status = queue_status(engine, app.Task, now=now)
    assert (status.oldest_ready_seconds, status.oldest_ready_paused_left_out) == (None, 2)
    with engine.begin() as conn:
        resume(conn, app.Task, ["parado", "ativo"])
    status = queue_status(engine, app.Task, now=now)
    assert 7100 < (status.oldest_ready_seconds or 0) < 7300
    assert status.oldest_ready_paused_left_out == 0


def cells(output: str) -> list[list[str]]:
    """A rich table's rows as their cells (borders dropped; the lines a
    long message wraps onto, with no id, left out)."""
    found = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in output.splitlines()
        if line.count("│") > 2
    ]
    return [row for row in found if row[1].isdigit()]


@pytest.mark.parametrize("db_url", ["postgresql", "sqlite"], indirect=True)
def test_status_shows_english_states_and_leaves_out_paused_processes(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    ids = english_history(engine, app)
    table = app.Task.__tablename__
    worker = ["tests.support.app:RecordingWorker", "--url", db_url]

    def timeline(task_id: int) -> str:
        done = cli("status", *worker, "--task", str(task_id), table=table)
        assert done.returncode == 0, done.stderr
        # no state column shows a stored status
        assert not [row for row in cells(done.stdout) if STORED & set(row)], done.stdout
        return done.stdout

    shown = timeline(ids["exhausted"])
    assert f"task {ids['exhausted']}: chain {ids['exhausted']} (faturar), failed; " in shown
    assert f"requeued as task {ids['requeued']}: running" in shown
    states = [row[3] for row in cells(shown)]
    assert states == ["retried", "failed", "dead-letter run succeeded", "running"]
    # the stored texts, each with its English after it (a cell may wrap)
    assert "always. Tarefa reenfileirada. [retry enqueued]" in shown
    assert "always. Máximo de tentativas atingido. [maximum attempts" in shown
    shown = timeline(ids["requeued"])
    assert (
        f"task {ids['requeued']}: requeued chain {ids['requeued']} of task "
        f"{ids['exhausted']} (faturar), running"
    ) in shown
    shown = timeline(ids["flaky"])
    assert f"chain {ids['flaky']} (flaky), succeeded" in shown
    assert "Tarefa reenfileirada. [retry enqueued]" in shown
    shown = timeline(ids["ready"])
    assert "Tarefa cancelada pelo operador. [cancelled by the operator]" in shown
    assert [row[3] for row in cells(shown)] == ["cancelled"]

    data = json.loads(
        cli("status", *worker, "--task", str(ids["rescued"]), "--json", table=table).stdout
    )
    assert [(row["status"], row["state"]) for row in data["rows"]] == [
        ("falha_processando", "rescued"),
        ("agendada", "scheduled"),
    ]
    assert data["state"] == "retrying"

    # relatorio holds the only ready tasks: paused, none is the oldest
    with engine.begin() as conn:
        pause(conn, app.Task, ["relatorio"])
    done = cli("status", *worker, table=table)
    assert done.returncode == 0, done.stderr
    assert "oldest ready task: none (1 paused process left out)" in done.stdout


# ------------------------------------------------------------ acting
def test_cancel_stops_a_waiting_chain_and_leaves_running_and_finished_ones(
    engine: Engine, app: App, installed: None
) -> None:
    ids = build_history(engine, app)
    with Session(engine) as session:
        client = QueueClient(session, app.Task)
        # the rescued task's retry waits: cancelling by the first attempt's id
        # stops its chain
        [attempt] = client.cancel(ids["rescued"])
        assert attempt != ids["rescued"]
        with pytest.raises(TaskStateError, match="is running"):
            client.cancel(ids["running"])
        with pytest.raises(TaskStateError, match="no pending or scheduled attempt"):
            client.cancel(ids["exhausted"])
        session.commit()
        row = session.get(app.Task, attempt)
        assert (row.status, row.retries_exhausted, row.message) == (
            "falha",
            False,
            "Tarefa cancelada pelo operador.",
        )
        assert row.finished_at is not None
    counts = queue_status(engine, app.Task).processes["lento"]
    assert (counts.running, counts.retrying, counts.failed, counts.cancelled) == (1, 0, 0, 1)
    # a cancelled task never runs: a worker for its process finds nothing
    with Session(engine) as session:

        class Slow(app.RecordingWorker):  # type: ignore[name-defined,misc]
            processes = frozenset({"lento"})

        assert run_until_empty(Slow, session).succeeded == 0


def test_cancel_process_older_than_and_retry_now(engine: Engine, app: App, installed: None) -> None:
    now = utcnow()
    with Session(engine) as session:
        old = [
            app.Task(process="p", payload={"n": n}, run_at=now - dt.timedelta(hours=2))
            for n in range(3)
        ]
        new = [app.Task(process="p", payload={"n": 9})]
        other = [app.Task(process="q", payload={"n": 1})]
        future = [app.Task(process="q", payload={"n": 2}, run_at=now + dt.timedelta(days=3))]
        session.add_all(old + new + other + future)
        session.flush()
        client = QueueClient(session, app.Task)
        cancelled = client.cancel_process("p", older_than=dt.timedelta(hours=1))
        assert sorted(cancelled) == sorted(task.id for task in old)
        assert client.cancel_process("p", older_than=dt.timedelta(hours=1)) == []
        # run the far-scheduled task now; a ready one cannot be
        attempt = client.retry_now(future[0].id)
        assert attempt == future[0].id
        with pytest.raises(TaskStateError, match="no scheduled attempt"):
            client.retry_now(other[0].id)
        session.commit()

        class Everything(app.RecordingWorker):  # type: ignore[name-defined,misc]
            pass

        outcome = run_until_empty(Everything, session)
        session.commit()
    # the new "p" task, "q"'s ready one and the one run now
    assert outcome.succeeded == 3
    totals = queue_status(engine, app.Task).totals
    assert (totals.cancelled, totals.failed) == (3, 0)


def race(engine: Engine, app: App, worker: Runner, task_id: int) -> tuple[bool, bool]:
    """A claim and a cancel of ``task_id`` at once: (claimed, cancelled)."""
    start = threading.Barrier(2)
    results: dict[str, bool] = {}

    def claim() -> None:
        with worker.adapter.connect_claim(engine) as conn:
            start.wait()
            results["claimed"] = bool(worker.manager.claim(conn, limit=1))

    def cancel() -> None:
        with Session(engine) as session:
            start.wait()
            try:
                results["cancelled"] = bool(QueueClient(session, app.Task).cancel(task_id))
                session.commit()
            except TaskStateError:
                results["cancelled"] = False

    threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results["claimed"], results["cancelled"]


def test_cancel_and_a_claim_at_the_same_moment_exactly_one_wins(
    engine: Engine, app: App, installed: None
) -> None:
    worker = runner(app.RecordingWorker, engine)
    for _ in range(15):
        with Session(engine) as session:
            task = app.Task(process="race", payload={"n": 1})
            session.add(task)
            session.commit()
            task_id = task.id
        won = race(engine, app, worker, task_id)
        with Session(engine) as session:
            status = session.get(app.Task, task_id).status
        assert won in ((True, False), (False, True)), (won, status)
        assert status == ("processando" if won[0] else "falha")
        with engine.begin() as conn:  # the claimed one finishes, out of the way
            conn.execute(update(app.Task).where(app.Task.id == task_id).values(status="sucesso"))


# ------------------------------------------------------------ the commands
def cli(*args: str, table: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SQLA_QUEUE_TEST_TABLE": table, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )


# the commands are the same on every database once the functions they call
# are (tested on all three above): PostgreSQL and SQLite (the default)
@pytest.mark.parametrize("db_url", ["postgresql", "sqlite"], indirect=True)
def test_status_json_and_task_and_the_action_commands(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    ids = build_history(engine, app)
    table = app.Task.__tablename__
    worker = ["tests.support.app:RecordingWorker", "--url", db_url]
    done = cli("status", *worker, "--json", table=table)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # exactly one JSON object
    reference = counts_by_definition(engine, app.Task.__table__)
    assert data["processes"] == reference
    assert data["totals"] == totals_of(reference)
    assert set(data) >= {"queue", "processes", "totals", "oldest_ready_seconds"}

    shown = cli("status", *worker, table=table)
    assert shown.returncode == 0, shown.stderr
    assert "relatorio" in shown.stdout and "Tarefa cancelada pelo operador." in shown.stdout

    timeline = cli("status", *worker, "--task", str(ids["exhausted"]), "--json", table=table)
    assert [row["kind"] for row in json.loads(timeline.stdout)["rows"]] == [
        "attempt",
        "attempt",
        "dead_letter",
        "requeued",
    ]
    missing = cli("status", *worker, "--task", "987654321", table=table)
    assert missing.returncode == 1 and missing.stderr.strip() == (
        f"Error: no task 987654321 in {table}"
    )

    cancelled = cli(
        "cancel", *worker, "--task", str(ids["rescued"]), "--task", str(ids["running"]), table=table
    )
    assert cancelled.returncode == 1
    assert f"task {ids['rescued']}: cancelled" in cancelled.stdout
    assert f"task {ids['running']} is running: not cancelled" in cancelled.stderr
    by_process = cli("cancel", *worker, "--process", "relatorio", table=table)
    assert by_process.returncode == 0, by_process.stderr
    assert by_process.stdout.strip() == "cancelled 3 waiting task(s) of relatorio"
    # the backoff task's retry waits 30 minutes: run it now
    now = cli("retry-now", *worker, "--task", str(ids["waiting"]), table=table)
    assert now.returncode == 0, now.stderr
    with Session(engine) as session:
        retry = session.scalars(select(app.Task).where(app.Task.initial_id == ids["waiting"])).one()
        assert retry.status == "pendente" and retry.run_at <= utcnow()
    usage = cli("cancel", *worker, table=table)
    assert usage.returncode == 2 and "give --task ID" in usage.stderr


def test_status_counts_a_cancelled_task_apart_from_a_failed_one(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """One task cancelled while it waited, one failed (its retries spent,
    its dead-letter run ran), one succeeded: ``status --json`` and the
    human ``status`` show each in its own state, and the numbers add up."""

    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    with Session(engine) as session:
        ok = app.Task(process="p", payload={"n": 1})
        failing = app.Task(process="p", payload={"fail": "always"})
        waiting = app.Task(process="p", payload={"n": 2}, run_at=utcnow() + dt.timedelta(days=1))
        session.add_all([ok, failing, waiting])
        session.commit()
        QueueClient(session, app.Task).cancel(waiting.id)
        session.commit()
        outcome = run_until_empty(Once, session)
        assert (outcome.succeeded, outcome.dead) == (1, 1)
        session.commit()
        assert task_timeline(session, app.Task, waiting.id).state == "cancelled"
    table = app.Task.__tablename__
    worker = ["tests.support.app:RecordingWorker", "--url", db_url]
    done = cli("status", *worker, "--json", table=table)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    expected = {
        **dict.fromkeys(STATES, 0),
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
        "dead_letter": 1,
    }
    assert data["totals"] == expected
    assert data["processes"] == {"p": expected}
    assert data["processes"] == counts_by_definition(engine, app.Task.__table__)
    # three tasks, each in one state (the dead-letter run is counted apart)
    assert sum(n for state, n in data["totals"].items() if state != "dead_letter") == 3
    # attempts: the success, the failure, the dead-letter run's success, the
    # cancellation; the parts add up to the finished ones
    recent = data["throughput"]
    assert (recent["finished"], recent["succeeded"], recent["failed"], recent["cancelled"]) == (
        4,
        2,
        1,
        1,
    )

    shown = cli("status", *worker, table=table)
    assert shown.returncode == 0, shown.stderr
    # the table's cells, without its borders
    lines = [
        [cell for cell in line.split() if cell not in "│┃"] for line in shown.stdout.splitlines()
    ]
    assert f"queue {table}: tasks by state" in shown.stdout
    assert ["process", *STATES] in lines
    # the process's row: a value under each state's column, in STATES' order
    assert ["p", *(str(expected[state]) for state in STATES)] in lines
    assert "attempts finished in the last 5.0 min: 4 " in shown.stdout
    assert "2 succeeded, 1 failed (33.3% of those that ran), 1 cancelled" in shown.stdout


#: what only a running worker needs: an operator's command does not import it
WORKER_ONLY = (
    "sqla_queue.worker.app",
    "sqla_queue.worker.runner",
    "sqla_queue.policies.fairness",
    "sqla_queue.stages.fanout",
)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cancel_builds_no_worker(engine: Engine, app: App, installed: None, db_url: str) -> None:
    """``cancel`` needs the configuration and the adapter (worker/operator.py),
    not the parts of a running worker (QueueApp: claims, fairness, stages)."""
    with Session(engine) as session, session.begin():
        task = app.Task(process="relatorio", payload={"n": 1})
        session.add(task)
        session.flush()
        task_id = task.id
    worker = "tests.support.app:RecordingWorker"
    command = ["cancel", worker, "--url", db_url, "--task", str(task_id)]
    program = (
        "import sys\n"
        "from sqla_queue.cli import main\n"
        f"main({command!r}, standalone_mode=False)\n"
        f"print(' '.join(m for m in {WORKER_ONLY!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "SQLA_QUEUE_TEST_TABLE": app.Task.__tablename__, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    cancelled, imported = done.stdout.splitlines()
    assert cancelled == f"task {task_id}: cancelled (attempt {task_id})"
    assert imported.split() == []
    with engine.connect() as conn:
        status = conn.execute(select(app.Task.status).where(app.Task.id == task_id)).scalar()
    assert status == "falha"


def test_a_failed_attempt_keeps_its_traceback_masked_and_bounded(
    engine: Engine, app: App, installed: None
) -> None:
    class Leaky(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if payload.get("deep"):
                return deep_calls["f0"]()  # type: ignore[no-any-return]
            if payload.get("n") == 2:
                return None
            raise ValueError("cannot reach postgresql://app:hunter2@db/prod (password=hunter2)")

    # 200 distinct frames (a recursion's repeated ones are folded into one line)
    source = (
        "".join(f"def f{i}():\n    return f{i + 1}()\n" for i in range(200))
        + "def f200():\n    raise RuntimeError('deep down')\n"
    )
    deep_calls: dict[str, Any] = {}
    exec(compile(source, "deep_calls.py", "exec"), deep_calls)

    with Session(engine) as session:
        leaky = app.Task(process="faturar", payload={"n": 1})
        deep = app.Task(process="faturar", payload={"deep": True})
        fine = app.Task(process="outro", payload={"n": 2})
        session.add_all([leaky, deep, fine])
        session.flush()
        run_until_empty(Leaky, session)
        session.commit()
        ids = (leaky.id, deep.id, fine.id)
    timeline = task_timeline(engine, app.Task, ids[0])
    failed = [row for row in timeline.rows if row.status == "falha"]
    assert len(failed) == 2
    for row in failed:
        assert row.traceback is not None
        assert row.traceback.startswith("Traceback (most recent call last):")
        assert "in execute" in row.traceback and "ValueError" in row.traceback
        assert "hunter2" not in row.traceback
    dead_run = timeline.of_kind("dead_letter")[0]
    assert dead_run.traceback is None  # it succeeded
    deep_rows = task_timeline(engine, app.Task, ids[1]).rows
    kept = deep_rows[0].traceback or ""
    assert len(kept) == 8000 and kept.startswith("…") and kept.endswith("RuntimeError: deep down")
    assert all(row.traceback is None for row in task_timeline(engine, app.Task, ids[2]).rows)
    # in the table, for SQL
    with engine.connect() as conn:
        stored = conn.execute(
            select(app.Task.error_traceback).where(app.Task.id == ids[0])
        ).scalar_one()
    assert stored == failed[0].traceback


def test_status_shows_which_routine_lock_is_held_by_whom(engine: Engine, app: App) -> None:
    """A running worker's routine locks, each with the server session that
    holds it and, on PostgreSQL, the worker's id (its session's name); SQLite
    cannot say (a lock file), and shows none."""
    runner = Runner.for_worker(app.RecordingWorker(), engine=engine, settings=Settings())
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        if engine.dialect.name == "sqlite":
            assert runner.maintenance.lock is not None
            wait_until(lambda: runner.maintenance.considered("schedule"), 10)
            assert queue_status(engine, app.Task).routine_locks == []
            return
        holders = wait_until(
            lambda: {h.routine: h for h in queue_status(engine, app.Task).routine_locks}.get(
                "schedule"
            ),
            60,  # the worker's start, on a loaded machine
            message="the schedule routine's lock held",
        )
        assert holders.session > 0
        assert holders.silent_seconds is not None and holders.silent_seconds < 60
        if engine.dialect.name == "postgresql":
            assert holders.worker == runner.app.worker_id
        shown = queue_status(engine, app.Task).as_json()["routine_locks"]
        assert {"routine", "session", "worker", "client", "silent_seconds"} <= set(shown[0])
    finally:
        runner.stop()
        thread.join(10)
    # given back at the stop
    assert queue_status(engine, app.Task).routine_locks == []


def test_a_lock_taken_after_the_status_read_the_session_list_shows_its_worker(
    engine: Engine, app: App
) -> None:
    """queue_status reads the session list for the vacuum horizon before the
    locks; PostgreSQL keeps that first read for the transaction, so a lock
    whose session was named after it was shown with no worker (seen in CI
    under load). The holders are read from the session list as it is now."""
    table = app.Task.__table__
    adapter = adapter_for(engine.dialect, table, channel_of(app.Task, table))
    lock = routine_lock_for(engine, adapter)
    if hasattr(lock, "owner"):
        lock.owner = "worker-late"
    try:
        with engine.connect() as conn, conn.begin():
            adapter.table_health(conn)  # the session list, read first
            assert lock.try_acquire("schedule")
            holders = adapter.routine_lock_holders(conn, keys={routine_key("schedule"): "schedule"})
        if engine.dialect.name == "sqlite":
            assert holders == []
            return
        assert [h.routine for h in holders] == ["schedule"]
        if engine.dialect.name == "postgresql":
            assert holders[0].worker == "worker-late"
    finally:
        lock.release("schedule")


# ------------------------------------------------------------ hostile text
#: what a webhook endpoint's response body may hold: the window title (OSC
#: 0 ended by BEL), a screen clear, a hidden link (OSC 8), a C1 CSI, a bidi
#: override and isolate, DEL, a tag character (hidden text)
HOSTILE = (
    "\x1b]0;pwned\x07 \x1b[2J \x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ "
    "\x9b31m \u202eevil\u202c \x7f\u2066x\u2069 \U000e0041"
)
HOSTILE_PROCESS = "p\x1b[2J\u202e\x9b"
HOSTILE_KEY = "k\x1b]8;;x\x07\u202e"
HOSTILE_WORKER = "w\x1b[8m\u2067\x07"


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on or hide (newlines
    aside), by Unicode's categories: C0, DEL, C1, format, separators,
    surrogates."""
    return [
        c for c in text if c != "\n" and unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp", "Cs"}
    ]


def test_escape_controls_leaves_nothing_a_terminal_acts_on() -> None:
    """Every character of the categories raw_controls() looks for becomes a
    visible ASCII escape (ZWNJ and ZWJ excepted: scripts and emoji need
    them); the rest of the text, backslashes included, stays."""
    kept = {"\u200c", "\u200d"}
    for code in range(0x110000):
        c = chr(code)
        if unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp", "Cs"} and c not in kept:
            escaped = escape_controls(f"a{c}b")
            assert escaped.isascii() and escaped.isprintable(), (hex(code), escaped)
            assert escaped.startswith("a\\") and escaped.endswith("b"), escaped
    assert escape_controls("\x1b[2J\u202e\x9b\U000e0041") == "\\x1b[2J\\u202e\\x9b\\U000e0041"
    assert escape_controls("açúcar 𝄞 C:\\tmp 👨\u200d👩") == "açúcar 𝄞 C:\\tmp 👨\u200d👩"
    assert escape_controls("a\nb\r\nc\rd") == "a\\x0ab\\x0d\\x0ac\\x0dd"
    assert escape_controls("a\nb\r\nc\rd\x1b", multiline=True) == "a\nb\nc\\x0dd\\x1b"
    # the same JSON values, no raw character a terminal acts on
    line = json.dumps({"m": HOSTILE + "\ud800"}, ensure_ascii=False)
    assert json.loads(escape_json_line(line)) == json.loads(line)
    assert raw_controls(escape_json_line(line)) == []


def hostile_history(engine: Engine, app: App) -> dict[str, int]:
    """A task of HOSTILE_PROCESS and HOSTILE_KEY whose handler failed with
    HOSTILE (its retries spent: a dead-letter run), and a running task of a
    worker whose id is HOSTILE_WORKER."""

    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    with Session(engine) as session:
        failed = app.Task(
            process=HOSTILE_PROCESS, external_key=HOSTILE_KEY, payload={"fail": HOSTILE}
        )
        session.add(failed)
        session.flush()
        assert run_until_empty(Once, session).dead == 1
        running = app.Task(process=HOSTILE_PROCESS, payload={"n": 1})
        session.add(running)
        session.commit()
        ids = {"failed": failed.id, "running": running.id}
    with engine.begin() as conn:
        conn.execute(
            update(app.Task)
            .where(app.Task.id == ids["running"])
            .values(
                status="processando",
                worker_id=HOSTILE_WORKER,
                started_at=utcnow(),
                lease_expires_at=utcnow() + dt.timedelta(hours=1),
            )
        )
    return ids


def _hostile_cli(engine: Engine, app: App, db_url: str) -> tuple[Any, Any, Any]:
    """The hostile history, its failed task's stored message and traceback,
    and ``human(*args)``: a CLI command's output, which must hold no raw
    control character."""
    ids = hostile_history(engine, app)
    with engine.connect() as conn:
        message, traceback = conn.execute(
            select(app.Task.message, app.Task.error_traceback).where(app.Task.id == ids["failed"])
        ).one()
    assert HOSTILE in message and HOSTILE in traceback
    table = app.Task.__tablename__
    worker = ["tests.support.app:RecordingWorker", "--url", db_url]

    def human(*args: str, json_out: bool = False) -> Any:
        done = cli(*args[:1], *worker, *args[1:], table=table)
        assert done.returncode == 0, done.stderr
        assert raw_controls(done.stdout + done.stderr) == [], (args, done.stdout)
        return json.loads(done.stdout) if json_out else done.stdout

    return ids, (message, traceback), human


def test_stored_control_characters_never_reach_the_terminal(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """A task's processo, message, traceback and worker id holding ESC
    sequences, OSC 8 links, BEL, C1 and bidi overrides, on every database:
    ``status`` shows them escaped (``\\x1b``, ``\\u202e``); ``--json`` gives
    back the exact stored text."""
    _, (message, _), human = _hostile_cli(engine, app, db_url)
    shown = human("status")
    for part in ("\\x1b]0;pwned\\x07", "\\x9b31m", "\\u202eevil\\u202c", "\\U000e0041"):
        assert part in shown  # the message, in the failures
    assert "p\\x1b[2J\\u202e\\x9b" in shown  # the process
    assert "w\\x1b[8m\\u2067\\x07" in shown  # the running task's worker
    # --json: json.dumps' escapes, and the exact stored text back
    data = human("status", "--json", json_out=True)
    assert HOSTILE_PROCESS in data["processes"]
    assert [f["message"] for f in data["failures"]] == [message]
    assert [r["worker_id"] for r in data["running"]] == [HOSTILE_WORKER]


# the other commands print what the same functions read (tested above on
# every database): SQLite
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_stored_control_characters_never_reach_the_terminal_from_any_command(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """The same text through ``status --task`` (human and ``--json``),
    ``requeue --dry-run``, ``pause`` and ``resume``."""
    ids, (message, traceback), human = _hostile_cli(engine, app, db_url)
    timeline = human("status", "--task", str(ids["failed"]))
    assert "k\\x1b]8;;x\\x07\\u202e" in timeline  # chave_externa, in its title
    assert "\\x1b]8;;https://evil.example/\\x1b\\click" in timeline
    assert "Traceback (most recent call last):\n" in timeline  # a traceback keeps its lines
    listing = human("requeue", "--all", "--dry-run")
    assert f"(task {ids['failed']}, p\\x1b[2J\\u202e\\x9b) (dry run)" in listing
    human("pause", "--process", HOSTILE_PROCESS)
    assert "resumed: p\\x1b[2J\\u202e\\x9b;" in human("resume", "--all")
    data = human("status", "--task", str(ids["failed"]), "--json", json_out=True)
    assert (data["process"], data["external_key"]) == (HOSTILE_PROCESS, HOSTILE_KEY)
    first = data["rows"][0]
    assert (first["message"], first["traceback"]) == (message, traceback)
