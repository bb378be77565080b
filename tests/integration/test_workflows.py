"""Workflows (docs/workflows.md): chains, groups and callbacks, released in
the transaction of the last parent's ``sucesso``, on SQLite, PostgreSQL and
MariaDB (the ``engine`` fixture). Workers run in-process (``drain``: a
burst worker, several lanes where a test says so)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, QueueClient, TaskNotFoundError, chain, group
from sqla_queue.adapters import adapter_of
from sqla_queue.config.settings import Settings
from sqla_queue.ops.workflow_view import workflow_status
from sqla_queue.policies import hooks
from sqla_queue.schema.mixins import GATE_FANIN, workflow_tables
from sqla_queue.schema.rows import (
    CANCELLED_MESSAGE,
    NOT_NEEDED_MESSAGE,
    STEP_MESSAGE,
    STOPPED_MESSAGE,
)
from sqla_queue.worker import Runner
from tests.integration.test_worker import drain, effects, tasks
from tests.support.app import App


# --------------------------------------------------------------------- helpers
class Finished:
    """The ``workflow_finished`` events the process's hooks tell, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str]] = []

    def _observe(self, event: Any) -> None:
        self.events.append((event.workflow_id, event.outcome))

    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        hooks.registry.add(hooks.WORKFLOW_FINISHED, self._observe)
        try:
            yield
        finally:
            hooks.registry.remove(hooks.WORKFLOW_FINISHED, self._observe)


def app_outcome(conn: Any, app: App, workflow_id: int) -> str | None:
    """The outcome written on the workflow's end."""
    return adapter_of(conn.dialect, app.Task.__table__).workflow.outcome_of(
        conn, workflow_id=workflow_id
    )


def step(app: App, name: str, **payload: Any) -> Any:
    """An unsaved task named ``name`` (its handler returns the name)."""
    return app.Task(process="faturar", payload={"name": name, **payload})


class Seen:
    """What each step's handler saw: its parents' results, by step name,
    and, for a step marked ``check``, whether every other task had
    committed ``sucesso`` when it started (read on another connection)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parents: dict[str, list[Any]] = {}
        self.runs: list[str] = []
        self.others_committed: list[bool] = []
        #: steps with ``fail`` in their payload succeed from now on (a fix deployed)
        self.healed = False


def flow_worker(app: App, seen: Seen, observer: Engine | None = None, **attributes: Any) -> Any:
    """A worker class whose handler records what it saw, writes an Effect
    row (committed with its ``sucesso``), fails when its payload says so,
    and returns its name (or ``value``) as its result."""

    class Flow(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> Any:
            name = payload["name"]
            parents = task.parent_results()
            if payload.get("check") and observer is not None:
                with observer.connect() as conn:
                    others = conn.execute(
                        select(app.Task.status).where(app.Task.id != task.id)
                    ).scalars()
                    committed = all(status == "sucesso" for status in others)
                with seen.lock:
                    seen.others_committed.append(committed)
            with seen.lock:
                seen.parents[name] = parents
                seen.runs.append(name)
            session.add(app.Effect(task_id=task.id, chain_id=task.chain_id, note=name))
            failing = payload.get("fail") and not seen.healed
            if failing or (payload.get("fail_first") and task.attempt == 1):
                raise RuntimeError(f"step {name} fails on purpose")
            return payload.get("value", name)

    for key, value in attributes.items():
        setattr(Flow, key, value)
    return Flow


def enqueue_flow(engine: Engine, flow: Any, **options: Any) -> int:
    """Enqueue ``flow`` and commit; its tasks keep their ids to read."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return int(flow.enqueue(session, **options))


def ran(engine: Engine, app: App) -> list[str]:
    """The names of the steps whose effect committed, in commit order."""
    return [str(note) for _, _, note in effects(engine, app)]


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


# --------------------------------------------------------------------- chains
def test_a_chain_runs_in_order_and_each_step_reads_its_parents_result(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    a, b, c = (step(app, name, value={"from": name}) for name in "abc")
    workflow_id = enqueue_flow(engine, chain(a, b, c))
    assert workflow_id == a.id < b.id < c.id
    waiting = [(t.status, t.run_at is None) for t in tasks(engine, app)]
    assert waiting == [("pendente", False), ("agendada", True), ("agendada", True)]

    drain(flow_worker(app, seen), engine)

    assert ran(engine, app) == ["a", "b", "c"]
    assert seen.parents == {"a": [], "b": [{"from": "a"}], "c": [{"from": "b"}]}
    assert [t.status for t in tasks(engine, app)] == ["sucesso"] * 3


def test_a_parent_that_succeeds_at_its_second_attempt_still_releases_its_child(
    engine: Engine, app: App, installed: None
) -> None:
    """The claim reads the children of the tasks marked STEP_MESSAGE only:
    the enqueue marks the steps others wait for, and a retry carries the
    mark (without it the retry's success would release nothing and the
    child would wait for good)."""
    seen = Seen()
    a, b = step(app, "a", fail_first=True), step(app, "b")
    enqueue_flow(engine, chain(a, b))
    assert [t.message for t in tasks(engine, app)] == [STEP_MESSAGE, STEP_MESSAGE]

    drain(flow_worker(app, seen, max_retry=2), engine)

    assert ran(engine, app) == ["a", "b"]  # the first attempt's effect rolled back
    # by id: a's first attempt, b, a's retry
    assert [(t.attempt, t.status) for t in tasks(engine, app)] == [
        (1, "falha"),
        (1, "sucesso"),
        (2, "sucesso"),
    ]


def test_an_enqueue_rolled_back_leaves_no_task_step_or_edge(
    engine: Engine, app: App, installed: None
) -> None:
    flow = chain(step(app, "a"), group(step(app, "b"), step(app, "c")), step(app, "d"))
    with Session(engine) as session:
        session.begin()
        assert flow.enqueue(session) > 0
        session.rollback()
    tables = workflow_tables(app.Task.__table__)
    assert [count(engine, t) for t in (app.Task.__table__, tables.steps, tables.edges)] == [0] * 3


def test_a_steps_result_that_is_not_json_fails_the_step_in_one_line(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()

    class NotJson(flow_worker(app, seen)):  # type: ignore[misc]
        max_retry = 1

        def execute(self, payload: Any, task: Any, session: Session) -> Any:
            super().execute(payload, task, session)
            return {1, 2} if payload["name"] == "a" else None

    enqueue_flow(engine, chain(step(app, "a"), step(app, "b")))
    drain(NotJson, engine)
    first = tasks(engine, app)[0]
    assert first.status == "falha"
    assert first.message.startswith("StepResultError: a workflow step must return a JSON value")
    assert "\n" not in first.message
    assert "b" not in seen.runs  # stopped: the workflow's default policy


# --------------------------------------------------------------------- groups
def test_a_group_callback_sees_its_groups_results_in_the_groups_order(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    # claimed in priority order c, b, a: the callback still sees a, b, c
    a, b, c = (step(app, name) for name in "abc")
    for task, priority in ((a, 10), (b, 50), (c, 90)):
        task.priority = priority
    enqueue_flow(engine, group(a, b, c).then(step(app, "callback")))

    drain(flow_worker(app, seen), engine)

    assert ran(engine, app) == ["c", "b", "a", "callback"]
    assert seen.parents["callback"] == ["a", "b", "c"]


def test_a_group_of_200_releases_its_callback_once_after_every_parent_committed(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    seen = Seen()
    names = [f"p{i}" for i in range(200)]
    parents = [step(app, name) for name in names]
    enqueue_flow(engine, group(*parents).then(step(app, "callback", check=True)))

    drain(flow_worker(app, seen, observer), engine, concurrency=4)

    done = ran(engine, app)
    assert sorted(done) == sorted([*names, "callback"])  # each once
    assert done[-1] == "callback"
    assert seen.runs.count("callback") == 1
    assert seen.others_committed == [True]
    assert seen.parents["callback"] == names


def test_a_diamond_and_a_chain_of_20_run_each_step_once_in_order_on_four_lanes(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    seen = Seen()
    middle = [f"m{i}" for i in range(30)]
    diamond = chain(
        step(app, "top"), group(*(step(app, name) for name in middle)), step(app, "bottom")
    )
    links = [f"c{i}" for i in range(20)]
    enqueue_flow(engine, diamond)
    enqueue_flow(engine, chain(*(step(app, name, value=i) for i, name in enumerate(links))))

    drain(flow_worker(app, seen, observer), engine, concurrency=4)

    done = ran(engine, app)
    assert sorted(done) == sorted(["top", *middle, "bottom", *links])  # each once
    order = {name: at for at, name in enumerate(done)}
    assert all(order["top"] < order[name] < order["bottom"] for name in middle)
    assert [order[name] for name in links] == sorted(order[name] for name in links)
    assert seen.parents["bottom"] == middle
    assert seen.parents["m7"] == ["top"]
    assert [seen.parents[name] for name in links[1:]] == [[i] for i in range(19)]


# --------------------------------------------------------------------- failures
def test_the_stop_policy_cancels_the_steps_after_a_dead_step(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    flow = chain(
        step(app, "a"),
        group(step(app, "bad", fail=True), step(app, "good")),
        step(app, "callback"),
        step(app, "after"),
    )
    workflow_id = enqueue_flow(engine, flow)

    drain(flow_worker(app, seen, max_retry=2), engine)

    assert "callback" not in seen.runs and "after" not in seen.runs
    rows = {t.payload["name"]: t for t in tasks(engine, app) if not t.dead and t.attempt == 1}
    for name in ("callback", "after"):
        assert (rows[name].status, rows[name].message) == ("falha", STOPPED_MESSAGE)
    assert rows["good"].status == "sucesso"
    steps = workflow_tables(app.Task.__table__).steps
    with engine.connect() as conn:
        states = dict(
            conn.execute(
                select(steps.c.step_id, steps.c.state).where(steps.c.workflow_id == workflow_id)
            ).all()
        )
    assert states[rows["callback"].id] == states[rows["after"].id] == "cancelled"
    assert states[rows["good"].id] is None
    # the dead-letter run of "bad" ran (and released nothing)
    assert [t.status for t in tasks(engine, app) if t.dead] == ["sucesso"]


def test_the_continue_policy_runs_the_callback_with_none_for_the_dead_step(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    flow = group(step(app, "bad", fail=True), step(app, "good")).then(step(app, "callback"))
    enqueue_flow(engine, flow, on_failure="continue")

    drain(flow_worker(app, seen, max_retry=2), engine)

    assert seen.runs.count("callback") == 1
    assert seen.parents["callback"] == [None, "good"]


def test_compensation_runs_once_when_a_step_dies_and_the_steps_after_it_stop(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    flow = group(step(app, "bad", fail=True), step(app, "good")).then(step(app, "callback"))
    workflow_id = enqueue_flow(engine, flow, compensate=step(app, "undo"))
    finished = Finished()

    with finished.observing():
        drain(flow_worker(app, seen, max_retry=2), engine)

    assert sorted(seen.runs) == ["bad", "bad", "good", "undo"]
    rows = {t.payload["name"]: t for t in tasks(engine, app) if not t.dead and t.attempt == 1}
    assert (rows["callback"].status, rows["callback"].message) == ("falha", STOPPED_MESSAGE)
    assert rows["undo"].status == "sucesso"
    assert finished.events == [(workflow_id, "failed")]


def test_compensation_is_cancelled_when_the_workflow_succeeds(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    workflow_id = enqueue_flow(
        engine, chain(step(app, "a"), step(app, "b")), compensate=step(app, "undo")
    )
    finished = Finished()

    with finished.observing():
        drain(flow_worker(app, seen), engine)

    assert seen.runs == ["a", "b"]
    undo = [t for t in tasks(engine, app) if t.payload["name"] == "undo"]
    assert [(t.status, t.message) for t in undo] == [("falha", NOT_NEEDED_MESSAGE)]
    assert finished.events == [(workflow_id, "succeeded")]
    # the operator's view: the cancelled compensation does not make it "cancelled"
    shown = workflow_status(engine, app.Task, workflow_id)
    assert shown.state == "succeeded"
    assert [s.compensation for s in shown.steps] == [False, False, True]


def test_compensate_is_refused_with_continue_and_without_a_task(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as session:
        with pytest.raises(ConfigurationError, match="cannot go with compensate"):
            chain(step(app, "a")).enqueue(
                session, on_failure="continue", compensate=step(app, "undo")
            )
        with pytest.raises(ConfigurationError, match="needs a compensate= task"):
            chain(step(app, "a")).enqueue(session, on_failure="compensate")
        assert not session.new


def test_a_requeued_dead_step_resumes_its_stopped_workflow(
    engine: Engine, app: App, installed: None
) -> None:
    """A step dies, the steps after it stop; a fix, a requeue of the dead
    step: it runs, the stopped steps wait for it again, run in order with
    its result, and the workflow ends succeeded (after it had failed)."""
    seen = Seen()
    bad = step(app, "bad", fail=True)
    workflow_id = enqueue_flow(engine, chain(step(app, "a"), bad, step(app, "c"), step(app, "d")))
    finished = Finished()
    with finished.observing():
        drain(flow_worker(app, seen, max_retry=1), engine)
        assert "c" not in seen.runs
        seen.healed = True
        with Session(engine) as session, session.begin():
            [requeued] = QueueClient(session, app.Task).requeue_dead([bad.id])
        drain(flow_worker(app, seen, max_retry=1), engine)

    assert seen.runs[-3:] == ["bad", "c", "d"]
    assert seen.parents["c"] == ["bad"]
    assert requeued.live_id == bad.id
    assert finished.events == [(workflow_id, "failed"), (workflow_id, "succeeded")]
    with engine.connect() as conn:
        assert app_outcome(conn, app, workflow_id) == "succeeded"


def test_a_groups_callback_waits_on_barriers_and_each_end_is_counted_once(
    engine: Engine, app: App, installed: None
) -> None:
    """A group larger than GATE_FANIN: its callback's gate counts barriers
    (blocks of about sqrt(n) parents), never below 0; a group without a
    callback ends its workflow once, the metric counts it after the commit."""
    from prometheus_client import CollectorRegistry

    from sqla_queue.ops.metrics import QueueMetrics

    seen = Seen()
    n = GATE_FANIN * 2 + 1
    with_callback = enqueue_flow(
        engine, group(*(step(app, f"p{i}") for i in range(n))).then(step(app, "callback"))
    )
    alone = enqueue_flow(engine, group(*(step(app, f"q{i}") for i in range(n))))
    gates = workflow_tables(app.Task.__table__).gates
    with engine.connect() as conn:
        rows = conn.execute(select(gates.c.owner_id, gates.c.slot, gates.c.waiting)).all()
    barriers = [w for owner, slot, w in rows if owner > 0 and slot > 0]
    assert len(barriers) > 1 and sum(barriers) == n and max(barriers) < GATE_FANIN
    metrics = QueueMetrics(app.Task.__tablename__, registry=CollectorRegistry()).attach()
    try:
        drain(flow_worker(app, seen), engine, concurrency=4)
        counted = metrics.registry.get_sample_value(
            "sqla_queue_workflows_total",
            {"queue": app.Task.__tablename__, "outcome": "succeeded"},
        )
    finally:
        metrics.detach()
    assert seen.runs.count("callback") == 1 and seen.parents["callback"] == [
        f"p{i}" for i in range(n)
    ]
    assert counted == 2
    with engine.connect() as conn:
        left = conn.execute(select(gates.c.waiting).where(gates.c.waiting != 0)).scalars().all()
        assert left == []
        assert app_outcome(conn, app, with_callback) == app_outcome(conn, app, alone)


def test_a_requeued_dead_step_under_continue_opens_no_gate_again(
    engine: Engine, app: App, installed: None
) -> None:
    """Its dead letter released the callback already: the requeued run
    succeeds and counts nothing down a second time."""
    seen = Seen()
    bad = step(app, "bad", fail=True)
    flow = (
        group(bad, step(app, "good"))
        .then(
            step(app, "callback"),
        )
        .then(step(app, "after"))
    )
    enqueue_flow(engine, flow, on_failure="continue")
    drain(flow_worker(app, seen, max_retry=1), engine)
    seen.healed = True
    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task).requeue_dead([bad.id])
    drain(flow_worker(app, seen, max_retry=1), engine)

    assert seen.runs.count("bad") == 2 and seen.runs.count("callback") == 1
    assert seen.runs.count("after") == 1
    gates = workflow_tables(app.Task.__table__).gates
    with engine.connect() as conn:
        assert conn.execute(select(func.min(gates.c.waiting))).scalar_one() == 0


# --------------------------------------------------------------------- cancel
def test_cancel_workflow_cancels_its_waiting_steps(
    engine: Engine, app: App, installed: None
) -> None:
    seen = Seen()
    a, b, c = (step(app, name) for name in "abc")
    other = step(app, "other")
    workflow_id = enqueue_flow(engine, chain(a, group(b, c)))
    enqueue_flow(engine, chain(other))
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task)
        assert client.cancel_workflow(workflow_id) == [a.id, b.id, c.id]
        with pytest.raises(TaskNotFoundError, match="no workflow"):
            client.cancel_workflow(other.id + 1000)

    drain(flow_worker(app, seen), engine)

    assert seen.runs == ["other"]
    statuses = [(t.status, t.message) for t in tasks(engine, app)][:3]
    assert statuses == [("falha", CANCELLED_MESSAGE)] * 3


# --------------------------------------------------------------------- old tables
def test_a_worker_on_a_database_without_the_workflow_tables_runs_ordinary_tasks(
    engine: Engine, app: App, installed: None
) -> None:
    tables = workflow_tables(app.Task.__table__)
    for table in (tables.gates, tables.edges, tables.steps):
        table.drop(engine)
    try:
        with Session(engine) as session, session.begin():
            session.add_all([step(app, "plain"), step(app, "broken", fail=True)])
        seen = Seen()
        worker = flow_worker(app, seen, max_retry=1)()
        runner = Runner.for_worker(worker, engine=engine, settings=Settings(), burst=True)
        assert runner.run() == 0
        assert runner.manager.steps.present is False
        assert sorted(seen.runs) == ["broken", "plain"]
        assert sorted((t.dead, t.status) for t in tasks(engine, app)) == [
            (False, "falha"),
            (False, "sucesso"),
            (True, "sucesso"),
        ]
    finally:  # the engine fixture drops every table of the metadata
        for table in (tables.steps, tables.edges, tables.gates):
            table.create(engine)


def test_the_stored_result_is_json(engine: Engine, app: App, installed: None) -> None:
    seen = Seen()
    enqueue_flow(engine, chain(step(app, "a", value=[1, "é", None]), step(app, "b")))
    drain(flow_worker(app, seen), engine)
    steps = workflow_tables(app.Task.__table__).steps
    with engine.connect() as conn:
        stored = conn.execute(select(steps.c.result).order_by(steps.c.step_id)).scalars().all()
    # the last step's too: a workflow's result is that of its steps without children
    assert [None if text is None else json.loads(text) for text in stored] == [[1, "é", None], "b"]


def test_the_async_twins_enqueue_and_cancel_a_workflow(
    engine: Engine, app: App, installed: None
) -> None:
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

    from sqla_queue import AsyncQueueClient
    from tests.integration.test_async_enqueue import run

    a, b = step(app, "a"), step(app, "b")

    async def body(aengine: AsyncEngine) -> tuple[int, list[int]]:
        async with AsyncSession(aengine) as session, session.begin():
            workflow_id = await chain(a, b).enqueue_async(session)
        async with AsyncSession(aengine) as session, session.begin():
            return workflow_id, await AsyncQueueClient(session, app.Task).cancel_workflow(
                workflow_id
            )

    workflow_id, cancelled = run(engine, body)
    rows = tasks(engine, app)
    assert cancelled == [row.id for row in rows] and workflow_id == rows[0].id
    assert [(t.status, t.message) for t in rows] == [("falha", CANCELLED_MESSAGE)] * 2


def test_run_until_empty_runs_a_workflow_in_the_tests_transaction(
    engine: Engine, app: App, installed: None
) -> None:
    """sqla_queue.testing: the release happens in the test's transaction,
    and the next claim there finds the callback."""
    from sqla_queue.testing import run_until_empty

    seen = Seen()
    with Session(engine) as session:
        session.begin()
        group(step(app, "a"), step(app, "b")).then(step(app, "c")).enqueue(session)
        outcome = run_until_empty(flow_worker(app, seen), session)
        assert (outcome.succeeded, outcome.failed) == (3, 0)
        assert seen.parents["c"] == ["a", "b"]
        session.rollback()
    assert tasks(engine, app) == []
