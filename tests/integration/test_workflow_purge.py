"""The purge of the workflow tables (docs/workflows.md, "Retention"), through
the purge routine a worker schedules and ``sqla-queue maintenance run
purge`` runs, on SQLite, PostgreSQL and MariaDB (the ``engine`` fixture):
a workflow whose task rows are all gone loses its steps, edges and gates;
one with any task row left keeps all of them."""

from __future__ import annotations

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from sqlalchemy.schema import DropTable

from sqla_queue import chain, group
from sqla_queue.maintenance import PurgeRoutine
from sqla_queue.schema.mixins import workflow_tables
from tests.integration.test_maintenance import age_rows, runner
from tests.integration.test_worker import drain, enqueue, tasks
from tests.support.app import App


def _flow(engine: Engine, app: App, size: int) -> int:
    """A workflow of ``size`` steps (a chain of the first and a group of
    the others), committed; its id."""
    steps = [app.Task(process="faturar", payload={"n": n}) for n in range(size)]
    flow = chain(steps[0], group(*steps[1:])) if size > 1 else chain(steps[0])
    with Session(engine) as session, session.begin():
        return int(flow.enqueue(session))


def _rows(engine: Engine, app: App) -> dict[int, int]:
    """Workflow id -> its rows in steps, edges and gates (the edges and
    gates counted by their owner: a step, or the end's -W)."""
    tables = workflow_tables(app.Task.__table__)
    s = tables.steps.c
    with engine.connect() as conn:
        owner_of = dict(conn.execute(select(s.step_id, s.workflow_id)).all())
        found = dict.fromkeys(owner_of.values(), 0)
        for workflow in found:
            owner_of[-workflow] = workflow
        for column in (s.step_id, tables.edges.c.child_id, tables.gates.c.owner_id):
            for owner in conn.execute(select(column)).scalars():
                found[owner_of[owner]] += 1
    return found


def _purge(engine: Engine, app: App, **env: str) -> PurgeRoutine:
    routine = runner(app.RecordingWorker, engine, **env).maintenance.routine("purge")
    assert isinstance(routine, PurgeRoutine)
    return routine


def test_the_purge_takes_a_finished_workflows_rows_with_its_tasks_and_keeps_a_live_ones(
    engine: Engine, app: App, installed: None
) -> None:
    """Both workflows ran; the first's task rows are old and go, so do its
    workflow rows, in the same round. The second has one task row still
    recent (the queue's purge keeps it): it keeps every workflow row."""
    old, live = _flow(engine, app, 3), _flow(engine, app, 3)
    drain(app.RecordingWorker, engine)
    assert {task.status for task in tasks(engine, app)} == {"sucesso"}
    rows = _rows(engine, app)
    assert rows[old] == rows[live] > 3  # steps, edges and gates
    recent = max(task.id for task in tasks(engine, app))
    age_rows(engine, app, 70, *[task.id for task in tasks(engine, app) if task.id != recent])
    result = _purge(engine, app).run_once()
    assert result.error is None, result.error
    assert result.counts["chains"] == 5
    assert result.counts["workflows"] == 1
    assert result.counts["workflow_rows"] == rows[old]
    assert _rows(engine, app) == {live: rows[live]}
    assert [task.id for task in tasks(engine, app)] == [recent]


def test_a_workflow_with_any_task_row_left_keeps_its_rows_whatever_the_rows_status(
    engine: Engine, app: App, installed: None
) -> None:
    """Workflows that never ran (their steps waiting), and one whose rows an
    operator deleted but for a step's retry: all kept. The dry run counts
    only workflows without task rows already, and changes nothing."""
    waiting, retried, gone = (_flow(engine, app, 2) for _ in range(3))
    table = app.Task.__table__
    steps = workflow_tables(table).steps
    with engine.begin() as conn:
        step_ids = dict(conn.execute(select(steps.c.step_id, steps.c.workflow_id)).all())
        of_retried = [s for s, w in step_ids.items() if w == retried]
        conn.execute(update(table).where(table.c.id == of_retried[1]).values(status="falha"))
        conn.execute(
            table.insert().values(
                id_inicial=of_retried[1], tentativa=2, status="falha", processo="faturar"
            )
        )
        gone_ids = [s for s, w in step_ids.items() if w in (retried, gone)]
        conn.execute(table.delete().where(table.c.id.in_(gone_ids)))
    before = _rows(engine, app)
    dry = _purge(engine, app).run_once(dry_run=True)
    assert (dry.counts["workflows"], dry.counts["workflow_rows"]) == (1, before[gone])
    assert _rows(engine, app) == before
    result = _purge(engine, app).run_once()
    assert (result.counts["workflows"], result.counts["workflow_rows"]) == (1, before[gone])
    assert _rows(engine, app) == {waiting: before[waiting], retried: before[retried]}


def test_many_workflows_go_a_bounded_chunk_a_transaction(
    engine: Engine, app: App, installed: None
) -> None:
    """Eight workflows of 1 to 3 steps, every other one without task rows,
    QUEUE_PURGE_LIMIT 3 (steps per chunk): several chunks, a progress report
    after each; a round limit of 2 chunks leaves the rest to the next round."""
    sizes = [1, 3, 2, 1, 3, 2, 1, 2]
    flows = [_flow(engine, app, size) for size in sizes]
    table = app.Task.__table__
    steps = workflow_tables(table).steps
    gone = set(flows[::2])
    with engine.begin() as conn:
        ids = conn.execute(select(steps.c.step_id).where(steps.c.workflow_id.in_(gone)))
        conn.execute(table.delete().where(table.c.id.in_(list(ids.scalars()))))
    before = _rows(engine, app)
    reports: list[str] = []
    capped = _purge(engine, app, QUEUE_PURGE_LIMIT="3", QUEUE_PURGE_ROUND_LIMIT="2")
    first = capped.run_once(progress=lambda done, total, what: reports.append(what))
    assert first.counts["workflows"] == 2  # flows 0 and 2: a chunk each
    assert set(before) - set(_rows(engine, app)) == {flows[0], flows[2]}
    assert len(reports) == 2 and reports[-1].endswith(
        f"workflows 2, workflow rows {before[flows[0]] + before[flows[2]]}"
    )
    second = _purge(engine, app, QUEUE_PURGE_LIMIT="3").run_once()
    assert second.counts["workflows"] == 2
    assert _rows(engine, app) == {flow: before[flow] for flow in flows if flow not in gone}
    assert _purge(engine, app).run_once().counts["workflows"] == 0


def test_a_queue_made_before_the_workflow_tables_is_purged_without_them(
    engine: Engine, app: App, installed: None
) -> None:
    [old] = enqueue(engine, app, {"n": 1})
    drain(app.RecordingWorker, engine)
    age_rows(engine, app, 70, old)
    tables = workflow_tables(app.Task.__table__)
    with engine.begin() as conn:
        for table in (tables.gates, tables.edges, tables.steps):
            conn.execute(DropTable(table))
    result = _purge(engine, app).run_once()
    assert result.error is None, result.error
    assert result.counts == {"chains": 1, "rows": 1, "chunks": 1, "open_chains_kept": 0}
    assert tasks(engine, app) == []
