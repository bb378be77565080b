"""Workflows under the fleet fault test (issue 51's first acceptance line).

A diamond (one head, ``SIZE`` members side by side after it, one callback
after all of them) and a ``CHAIN``-step chain, each enqueued in one
transaction, are consumed by ``PROCESSES`` worker processes (the real CLI,
``LANES`` lanes each) on SQLite, PostgreSQL and MariaDB while faults hit
them, in ``ROUNDS`` rounds paced by the steps' progress (each round waits,
with a deadline, until another share of the effects has committed): a
worker process SIGKILLed and replaced every round, the whole fleet at once
in one round; on PostgreSQL ``pg_terminate_backend`` of every connection
every other round and a restart in one; on MariaDB ``KILL CONNECTION`` of
every connection every other round. SQLite gets the SIGKILLs only.

The steps (tests/support/workflow_app.py) write one effect row each in
their handler's transaction, and record what that transaction read of
their parents' effects and ``task.parent_results()``. Then, from the
database: each step's effect committed exactly once; each step saw all
its parents' effects committed and their results (the callback all
``SIZE``); each step's chain of attempts ended in one ``sucesso`` and no
row is open; ``sqla-queue status --workflow ID --json`` says
``succeeded`` for both workflows; and no worker exited on its own.

The suite runs one diamond of 300 and one chain of 40 per database; issue
51's acceptance sizes (1,000 and 100) by the environment. The long mode
keeps enqueueing a new pair, and the rounds of faults going, for
``WORKFLOW_FAULT_MINUTES``, then checks every pair::

    WORKFLOW_FAULT_SIZE=1000 WORKFLOW_FAULT_CHAIN=100 WORKFLOW_FAULT_MINUTES=5 \\
        SQLA_QUEUE_REQUIRE_DATABASES=1 .venv/bin/pytest \\
        -q -s -p no:cacheprovider tests/faults/test_workflow_faults.py

On a failure the workers' output and the rows are kept in the test's
``tmp_path`` (the assertion names the directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tests.acceptance.test_concurrency import Spawned, stop_gracefully, worker_env
from tests.conftest import run_cli, spawn_cli, wait_until
from tests.support.app import App, build
from tests.support.workflow_app import FlowApp, chain_of, diamond, parents_of, step_key
from tests.support.workflow_app import build as build_flow

WORKER = "tests.support.workflow_app:FlowWorker"
#: the diamond's members and the chain's steps: in the suite 300 (over
#: GATE_FANIN: the callback waits on barrier gates) and 40, to keep it in
#: its time budget; issue 51's sizes, 1,000 and 100, by the environment
#: (WORKFLOW_FAULT_SIZE=1000 WORKFLOW_FAULT_CHAIN=100)
SIZE = int(os.environ.get("WORKFLOW_FAULT_SIZE", "300"))
CHAIN = int(os.environ.get("WORKFLOW_FAULT_CHAIN", "40"))
PROCESSES, LANES = 3, 2
#: rounds of faults per pair of workflows; the one that kills every worker,
#: and the one that restarts PostgreSQL
ROUNDS, FLEET_ROUND, RESTART_ROUND = 6, 4, 2
#: seconds a round may wait for its share of the steps
ROUND_TIMEOUT = 60.0
#: the long mode's minutes (0: one pair of workflows)
MINUTES = float(os.environ.get("WORKFLOW_FAULT_MINUTES", "0"))
OPEN = {"agendada", "pendente", "processando"}


@dataclass
class Database:
    """Where the fleet runs, and the faults it has beside SIGKILLs."""

    url: str
    kill_connections: Callable[[], object] | None = None
    restart: Callable[[str], None] | None = None


@pytest.fixture(
    params=[
        "sqlite",
        # servers of the test's own, asked for by name below: marked by hand
        pytest.param("postgresql", marks=pytest.mark.servers),
        pytest.param("mysql", marks=pytest.mark.servers),
    ]
)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """SQLite in a file, or a server of the test's own (killing connections
    on the shared servers would hit other suites)."""
    if request.param == "sqlite":
        return Database(f"sqlite:///{tmp_path / 'queue.db'}")
    if request.param == "postgresql":
        postgres = request.getfixturevalue("private_postgres")
        return Database(postgres.url, postgres.terminate_backends, postgres.restart)
    mariadb = request.getfixturevalue("private_mariadb")
    return Database(mariadb.url, mariadb.kill_connections)


class Fleet:
    """``PROCESSES`` worker processes; a killed one is replaced at once.
    Keeps every process's output, the killed ones' too."""

    def __init__(self, args: tuple[str, ...], env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.workers = [self._spawn() for _ in range(PROCESSES)]
        self.gone: list[Spawned] = []
        self.kills = 0

    def _spawn(self) -> Spawned:
        return Spawned(spawn_cli(*self.args, env=self.env))

    def assert_running(self) -> None:
        """No worker exited on its own."""
        for worker in self.workers:
            assert worker.proc.poll() is None, worker.output

    def kill(self, index: int) -> None:
        self.workers[index].kill()
        self.gone.append(self.workers[index])
        self.workers[index] = self._spawn()
        self.kills += 1

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.proc.kill()
        for index in range(len(self.workers)):
            self.kill(index)

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()

    def outputs(self) -> str:
        return "\n".join(
            f"--- worker pid {w.proc.pid} ({'killed' if w in self.gone else 'last'}) ---\n"
            + w.output
            for w in [*self.gone, *self.workers]
        )


@dataclass
class Faults:
    """The faults injected beside SIGKILLs (``Fleet.kills``), for the report line."""

    connection_kills: int = 0
    restarts: int = 0


@pytest.fixture
def fleet_of() -> Iterator[Callable[..., Fleet]]:
    """Starts a :class:`Fleet`; kills what is left of it afterwards."""
    started: list[Fleet] = []

    def start(args: tuple[str, ...], env: dict[str, str]) -> Fleet:
        started.append(Fleet(args, env))
        return started[-1]

    yield start
    for fleet in started:
        fleet.close()


# a few minutes for the suite's run on a loaded two-core machine (past the
# suite's 120 s), and the long mode's minutes on top
@pytest.mark.timeout(300 + MINUTES * 60)
def test_workflows_run_each_step_once_through_kills_and_restarts(
    database: Database,
    table_name: str,
    installed: None,
    fleet_of: Callable[..., Fleet],
    tmp_path: Path,
) -> None:
    app = build(table_name)
    flow = build_flow(app)
    engine = create_engine(database.url, pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    # a short lease: SQLite finds a killed worker's tasks by its lease only
    env = worker_env(table_name, SQLA_QUEUE_TEST_LEASE="2", PYTHONFAULTHANDLER="1")
    args = ("worker", WORKER, "--url", database.url, "--concurrency", str(LANES))
    fleet = fleet_of((*args, "--log-level", "WARNING"), env)
    faults = Faults()
    rng = random.Random(51)
    pairs: list[tuple[str, str]] = []
    workflows: dict[str, int] = {}
    started = time.monotonic()
    try:
        while not pairs or time.monotonic() - started < MINUTES * 60:
            pair = (f"d{len(pairs)}", f"c{len(pairs)}")
            workflows[pair[0]] = _enqueue(engine, diamond(app, pair[0], SIZE))
            workflows[pair[1]] = _enqueue(engine, chain_of(app, pair[1], CHAIN))
            pairs.append(pair)
            expected = len(pairs) * (SIZE + 2 + CHAIN)
            share = (SIZE + 2 + CHAIN) // (ROUNDS + 1)  # of a pair's steps, per round
            for round_ in range(ROUNDS):
                goal = min(_committed(engine, flow) + share, expected)
                wait_until(
                    lambda goal=goal: _committed(engine, flow) >= goal,
                    timeout=ROUND_TIMEOUT,
                    message=f"{goal} of {expected} effects (round {round_})",
                )
                fleet.assert_running()
                _inject(database, fleet, faults, round_, len(pairs), rng)
                engine.dispose()  # its connections were killed too
        wait_until(
            lambda: _committed(engine, flow) >= expected and not _open(engine, app),
            timeout=ROUND_TIMEOUT * 2,
            message=f"all {expected} effects and no open task",
        )
        fleet.assert_running()
        elapsed = time.monotonic() - started
        _check(engine, app, flow, pairs, workflows, database.url, table_name)
        stop_gracefully(fleet.workers)
    except AssertionError as exc:
        kept = _keep(tmp_path, engine, app, flow, fleet)
        raise AssertionError(f"{exc}\n(evidence in {kept})") from exc
    finally:
        engine.dispose()
    print(
        f"\nWORKFLOW FAULTS {engine.dialect.name}: {len(pairs)} diamond(s) of 1 -> {SIZE} -> 1 "
        f"and {len(pairs)} chain(s) of {CHAIN}, {PROCESSES} processes x {LANES} lanes; "
        f"{fleet.kills} SIGKILLs, {faults.connection_kills} rounds of killed connections, "
        f"{faults.restarts} restarts; {_attempts(engine, app)}; {elapsed:.1f} s"
    )


def _inject(
    database: Database, fleet: Fleet, faults: Faults, round_: int, pair: int, rng: random.Random
) -> None:
    """Round ``round_``'s faults (see the module)."""
    if round_ == FLEET_ROUND:
        fleet.kill_all()
    else:
        fleet.kill(rng.randrange(len(fleet.workers)))
    if database.kill_connections is not None and round_ % 2:
        database.kill_connections()
        faults.connection_kills += 1
    if database.restart is not None and round_ == RESTART_ROUND:
        database.restart("fast" if pair % 2 else "immediate")
        faults.restarts += 1


def _enqueue(engine: Engine, workflow: Any) -> int:
    """Enqueue ``workflow`` in a transaction of its own; its id."""
    with Session(engine) as session, session.begin():
        return int(workflow.enqueue(session))


def _committed(engine: Engine, flow: FlowApp) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(flow.StepEffect)).scalar_one())


def _open(engine: Engine, app: App) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(app.Task.status.in_(OPEN))
        return int(conn.execute(query).scalar_one())


def _check(
    engine: Engine,
    app: App,
    flow: FlowApp,
    pairs: list[tuple[str, str]],
    workflows: dict[str, int],
    url: str,
    table_name: str,
) -> None:
    """Every step's effect once, after its parents; every chain of attempts
    ended in one ``sucesso``; the workflows ``succeeded``."""
    with engine.connect() as conn:
        effects = conn.execute(
            select(flow.StepEffect.step, flow.StepEffect.task_id, flow.StepEffect.seen)
        ).all()
        rows = conn.execute(select(app.Task.id, app.Task.initial_id, app.Task.status)).all()
    per_step = Counter(step for step, _, _ in effects)
    wanted = {
        step_key(name, role, n): parents_of(name, role, n, SIZE if name[0] == "d" else CHAIN)
        for diamond_name, chain_name in pairs
        for name, role, n in [
            (diamond_name, "head", 0),
            *((diamond_name, "member", n) for n in range(SIZE)),
            (diamond_name, "callback", 0),
            *((chain_name, "link", n) for n in range(CHAIN)),
        ]
    }
    twice = sorted(step for step, count in per_step.items() if count > 1)
    lost = sorted(set(wanted) - set(per_step))
    assert (twice, lost) == ([], []), f"steps run twice: {twice}; steps lost: {lost}"
    assert set(per_step) == set(wanted)
    too_early = [
        (step, seen)
        for step, _, seen in effects
        if json.loads(seen)
        != {
            "parent_rows": len(wanted[step]),
            "parent_steps": len(wanted[step]),
            "results": len(wanted[step]),
            "results_as_expected": True,
        }
    ]
    assert too_early == [], f"steps that saw their parents unfinished: {too_early[:20]}"
    # each chain of attempts: one 'sucesso', the attempt whose effect committed
    finished: dict[int, list[int]] = {}
    for task_id, initial_id, status in rows:
        assert status not in OPEN, (task_id, status)
        if status == "sucesso":
            finished.setdefault(initial_id or task_id, []).append(task_id)
    assert all(len(ids) == 1 for ids in finished.values()), finished
    assert len(finished) == len(wanted)
    assert sorted(task_id for _, task_id, _ in effects) == sorted(
        ids[0] for ids in finished.values()
    )
    # the CLI's view of each workflow; its processes side by side (each is an
    # interpreter's start-up, seconds on a loaded machine)
    with ThreadPoolExecutor() as pool:
        shown = pool.map(
            lambda workflow_id: run_cli(
                "status",
                WORKER,
                "--url",
                url,
                "--workflow",
                str(workflow_id),
                "--json",
                env=worker_env(table_name),
            ),
            workflows.values(),
        )
        for name, done in zip(workflows, shown, strict=True):
            status = json.loads(done.stdout)
            assert status["state"] == "succeeded", (name, status["state"], status["counts"])
            size = SIZE + 2 if name[0] == "d" else CHAIN
            assert len(status["steps"]) == size
            assert {step["state"] for step in status["steps"]} == {"succeeded"}


def _attempts(engine: Engine, app: App) -> str:
    """The task rows by status (the attempts the faults cut short are
    ``falha`` or ``falha_processando``), and the longest gap between two
    completions."""
    with engine.connect() as conn:
        rows = conn.execute(select(app.Task.status, func.count()).group_by(app.Task.status)).all()
        finished = conn.execute(
            select(app.Task.finished_at)
            .where(app.Task.status == "sucesso")
            .order_by(app.Task.finished_at)
        ).scalars()
        stall = max(((b - a).total_seconds() for a, b in pairwise(finished)), default=0.0)
    by_status = ", ".join(f"{status} {count}" for status, count in sorted(rows))
    return f"task rows {by_status}; the longest gap between two completions {stall:.1f} s"


def _keep(tmp_path: Path, engine: Engine, app: App, flow: FlowApp, fleet: Fleet) -> Path:
    """The workers' output and the rows, in ``tmp_path/evidence``."""
    kept = tmp_path / "evidence"
    kept.mkdir(exist_ok=True)
    (kept / "workers.log").write_text(fleet.outputs())
    engine.dispose()
    with contextlib.suppress(SQLAlchemyError), engine.connect() as conn:  # if it answers
        for name, table in (("tasks", app.Task.__table__), ("effects", flow.StepEffect.__table__)):
            found = conn.execute(select(table)).all()
            (kept / f"{name}.txt").write_text("\n".join(map(repr, found)))
    return kept
