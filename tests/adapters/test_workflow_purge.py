"""The conformance suite of ``adapter.workflow_purge``
(adapters/workflow_purge.py), on every database of the ``contract`` fixture:
what the purge routine relies on to delete the rows of workflows whose task
rows are all gone, and no other's.

The workflow rows are written here directly (steps, edges, gates: their
columns, not the workflow code's), so a workflow can be left with exactly
the task rows a test wants."""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import Connection, func, insert, select
from sqlalchemy.schema import DropTable

from sqla_queue.schema.mixins import workflow_tables
from tests.adapters.conftest import Contract


def _workflow(contract: Contract, conn: Connection, steps: list[int]) -> int:
    """Workflow rows for the steps ``steps`` (a chain: each waits for the
    one before), with a gate per step and the end's (owner -W); its id."""
    tables = workflow_tables(contract.adapter.table)
    workflow = min(steps)
    conn.execute(
        insert(tables.steps),
        [{"step_id": s, "workflow_id": workflow, "on_failure": "stop"} for s in steps],
    )
    edges = [(child, parent) for parent, child in itertools.pairwise(steps)]
    edges.append((-workflow, steps[-1]))  # the end waits for the last step
    conn.execute(
        insert(tables.edges),
        [{"child_id": c, "parent_id": p, "position": 0, "done": True} for c, p in edges],
    )
    conn.execute(
        insert(tables.gates),
        [{"owner_id": owner, "slot": 0, "waiting": 0} for owner in [*steps[1:], -workflow]],
    )
    return workflow


def _rows_of(contract: Contract, workflow: int, steps: list[int]) -> list[int]:
    """How many rows ``workflow`` has in steps, edges and gates."""
    tables = workflow_tables(contract.adapter.table)
    owners = [*steps, -workflow]
    with contract.engine.connect() as conn:
        return [
            int(conn.execute(select(func.count()).select_from(t).where(where)).scalar_one())
            for t, where in (
                (tables.steps, tables.steps.c.workflow_id == workflow),
                (tables.edges, tables.edges.c.child_id.in_(owners)),
                (tables.gates, tables.gates.c.owner_id.in_(owners)),
            )
        ]


def _task(contract: Contract, conn: Connection, **columns: Any) -> int:
    """One task row with ``columns`` (a status, ``id_inicial``, ``live_id``)."""
    table = contract.adapter.table
    task_id = contract.insert(conn)
    conn.execute(table.update().where(table.c.id == task_id).values(**columns))
    return task_id


def _delete_tasks(contract: Contract, conn: Connection, *ids: int) -> None:
    table = contract.adapter.table
    conn.execute(table.delete().where(table.c.id.in_(ids)))


def test_a_step_is_alive_while_any_row_of_its_chain_is_left(
    contract: Contract,
) -> None:
    """A step's first row, a retry (``id_inicial``) or a dead-letter run or
    requeued chain (``live_id``), whatever its status: each keeps its step
    alive; a step without any is not."""
    queries = contract.adapter.workflow_purge
    with contract.engine.begin() as conn:
        assert queries.tables_exist(conn)
        first = [_task(contract, conn, status="sucesso") for _ in range(2)]
        retried = [contract.insert(conn) for _ in range(2)]
        _task(contract, conn, id_inicial=retried[1], tentativa=2, status="falha")
        linked = [contract.insert(conn) for _ in range(2)]
        _task(contract, conn, live_id=linked[0], dead=True, status="sucesso")
        gone = [contract.insert(conn) for _ in range(3)]
        workflows = [_workflow(contract, conn, steps) for steps in (first, retried, linked, gone)]
        _delete_tasks(contract, conn, *retried, *linked, *gone)
    with contract.engine.connect() as conn:
        steps = queries.workflow_steps(conn, workflow_ids=workflows)
        assert sorted(steps) == [
            (step, workflow)
            for workflow, group in zip(workflows, (first, retried, linked, gone), strict=True)
            for step in group
        ]
        alive = queries.steps_alive(conn, step_ids=[*first, *retried, *linked, *gone])
        assert alive == {*first, retried[1], linked[0]}
        assert queries.steps_alive(conn, step_ids=[10**9]) == set()
        assert queries.steps_alive(conn, step_ids=[]) == set()


def test_the_rows_of_purged_workflows_go_from_every_table_and_no_others(
    contract: Contract,
) -> None:
    """Counted first (the dry run), then deleted: steps, edges and gates,
    the end's (owner -W) included; another workflow keeps all of its rows."""
    queries = contract.adapter.workflow_purge
    with contract.engine.begin() as conn:
        a = [contract.insert(conn) for _ in range(3)]
        b = [contract.insert(conn) for _ in range(2)]
        kept = [contract.insert(conn) for _ in range(2)]
        flows = {_workflow(contract, conn, steps): steps for steps in (a, b, kept)}
        _delete_tasks(contract, conn, *a, *b)
    wa, wb, wk = flows
    assert _rows_of(contract, wa, a) == [3, 3, 3]
    with contract.engine.connect() as conn:
        assert queries.workflow_rows_count(conn, workflow_ids=[wa, wb], step_ids=a + b) == 15
    assert _rows_of(contract, wa, a) == [3, 3, 3]
    with contract.engine.begin() as conn:
        assert queries.workflow_rows_delete(conn, workflow_ids=[wa, wb], step_ids=a + b) == 15
        assert queries.workflow_rows_delete(conn, workflow_ids=[wa, 10**9], step_ids=a) == 0
    assert _rows_of(contract, wa, a) == [0, 0, 0]
    assert _rows_of(contract, wb, b) == [0, 0, 0]
    assert _rows_of(contract, wk, kept) == [2, 2, 2]


def test_the_scan_gives_each_steps_workflow_by_workflow_id(contract: Contract) -> None:
    queries = contract.adapter.workflow_purge
    with contract.engine.begin() as conn:
        sizes = [3, 1, 2, 1]
        workflows = [
            _workflow(contract, conn, [contract.insert(conn) for _ in range(size)])
            for size in sizes
        ]
    each = [w for w, size in zip(workflows, sizes, strict=True) for _ in range(size)]
    with contract.engine.connect() as conn:
        assert queries.workflow_scan(conn, after=0, limit=10) == each
        assert queries.workflow_scan(conn, after=0, limit=2) == each[:2]
        assert queries.workflow_scan(conn, after=workflows[1], limit=10) == each[4:]
        assert queries.workflow_scan(conn, after=workflows[-1], limit=10) == []


def test_a_queue_made_before_the_workflow_tables_has_none(contract: Contract) -> None:
    queries = contract.adapter.workflow_purge
    tables = workflow_tables(contract.adapter.table)
    with contract.engine.begin() as conn:
        for table in (tables.gates, tables.edges, tables.steps):
            conn.execute(DropTable(table))
    with contract.engine.connect() as conn:
        assert not queries.tables_exist(conn)
