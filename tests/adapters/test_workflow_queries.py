"""The conformance suite of ``adapter.workflow`` (adapters/workflow.py), on
every database of the ``contract`` fixture: what the manager's release of
workflow steps (batch/workflow.py) relies on."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, select, update

from sqla_queue.common.types import utcnow
from sqla_queue.schema.rows import CANCELLED_MESSAGE
from tests.adapters.conftest import Contract

FUTURE = dt.timedelta(days=1)


def _waiting(contract: Contract, conn: Connection, count: int) -> list[int]:
    """``count`` new tasks waiting for parents (``agendada``, no time)."""
    ids = [contract.insert(conn, data_hora=utcnow() + FUTURE) for _ in range(count)]
    assert contract.adapter.workflow.task_wait_many(conn, ids=ids) == count
    return ids


def _rows(contract: Contract, ids: list[int]) -> list[tuple[Any, ...]]:
    c = contract.adapter.table.c
    with contract.engine.connect() as conn:
        statement = select(c.status, c.data_hora, c.mensagem).where(c.id.in_(ids)).order_by(c.id)
        return [tuple(row) for row in conn.execute(statement)]


def test_steps_edges_and_results_are_stored_and_read_in_the_parents_order(
    contract: Contract,
) -> None:
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        assert queries.tables_exist(conn)
        queries.tables_probe(conn)  # the rights a worker needs: this role has them
        a, b = contract.insert(conn), contract.insert(conn)
        [c] = _waiting(contract, conn, 1)
        queries.steps_insert_many(conn, rows=[(step, a, "continue") for step in (a, b, c)])
        queries.edges_insert_many(conn, rows=[(c, b, 0), (c, a, 1)])
        queries.results_write(conn, results=[(a, '{"a":1}'), (b, None)])
    with contract.engine.connect() as conn:
        assert sorted(queries.children_of(conn, parents=[a, b, 10**9])) == [(a, c), (b, c)]
        assert queries.parent_results(conn, step_id=c) == [None, '{"a":1}']  # b, then a
        assert queries.parent_results(conn, step_id=a) == []
        assert queries.step_of(conn, step_id=c) == (a, "continue")
        assert queries.step_of(conn, step_id=10**9) is None
        assert queries.steps_of_workflow(conn, workflow_id=a) == [a, b, c]
        assert queries.steps_of_workflow(conn, workflow_id=10**9) == []
        assert sorted(queries.edges_of_workflow(conn, workflow_id=a)) == [(a, c), (b, c)]


def test_a_waiting_step_is_neither_promoted_nor_claimed_until_released_once(
    contract: Contract,
) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        [step] = _waiting(contract, conn, 1)
        assert adapter.task_promote_due(conn) == 0
    assert _rows(contract, [step]) == [("agendada", None, None)]
    assert contract.claim() == []
    with contract.engine.begin() as conn:
        assert adapter.workflow.release(conn, ids=[step]) == 1
        assert adapter.workflow.release(conn, ids=[step]) == 0  # released already
    assert contract.claim() == [step]


def test_the_count_after_the_lock_sees_the_other_parents_commit(contract: Contract) -> None:
    """Two parents of one child complete in two transactions: the second,
    whose snapshot predates the first's commit, takes the child's lock,
    marks its edge and finds no edge left (a locking read), so it releases
    the child. SQLite has one writer at a time: the interleaving cannot
    happen there."""
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        a, b = contract.insert(conn), contract.insert(conn)
        [child] = _waiting(contract, conn, 1)
        queries.steps_insert_many(conn, rows=[(step, a, "stop") for step in (a, b, child)])
        queries.edges_insert_many(conn, rows=[(child, a, 0), (child, b, 1)])
    if contract.adapter.single_writer:
        with contract.engine.begin() as conn:
            queries.lock_tasks(conn, ids=[child])
            queries.edges_done(conn, parents=[a, b])
            assert queries.still_waiting(conn, children=[child]) == set()
        return
    with contract.engine.connect() as first, contract.engine.connect() as second:
        first.begin()
        queries.lock_tasks(first, ids=[child])
        queries.edges_done(first, parents=[a])
        assert queries.still_waiting(first, children=[child]) == {child}
        second.begin()
        assert queries.children_of(second, parents=[a, b])  # its snapshot: before the commit
        first.commit()
        queries.lock_tasks(second, ids=[child])
        queries.edges_done(second, parents=[b])
        assert queries.still_waiting(second, children=[child]) == set()
        assert queries.release(second, ids=[child]) == 1
        second.commit()
    assert _rows(contract, [child])[0][0] == "pendente"


def test_cancel_waiting_cancels_only_steps_that_wait_and_marks_them(contract: Contract) -> None:
    queries = contract.adapter.workflow
    steps = queries.steps
    with contract.engine.begin() as conn:
        ready = contract.insert(conn)
        waiting, released = _waiting(contract, conn, 2)
        queries.release(conn, ids=[released])
        every = [ready, waiting, released]
        queries.steps_insert_many(conn, rows=[(step, ready, "stop") for step in every])
        assert queries.cancel_waiting(conn, ids=every, message=CANCELLED_MESSAGE) == [waiting]
        states = dict(conn.execute(select(steps.c.step_id, steps.c.state)).all())
    assert states == {ready: None, waiting: "cancelled", released: None}
    assert [row[0] for row in _rows(contract, every)] == ["pendente", "falha", "pendente"]
    assert _rows(contract, [waiting])[0][2] == CANCELLED_MESSAGE


def test_open_rows_of_a_workflow_and_their_cancellation(contract: Contract) -> None:
    """The open rows of a workflow's steps: a first attempt waiting, ready
    or scheduled, and a retry (``id_inicial``); never a finished one or
    another workflow's."""
    adapter = contract.adapter
    queries = adapter.workflow
    c = adapter.table.c
    with contract.engine.begin() as conn:
        first, done, other = (contract.insert(conn) for _ in range(3))
        [waiting] = _waiting(contract, conn, 1)
        retry = contract.insert(conn, data_hora=utcnow() + FUTURE)
        conn.execute(update(adapter.table).where(c.id == retry).values(id_inicial=done))
        conn.execute(update(adapter.table).where(c.id == done).values(status="falha"))
        queries.steps_insert_many(
            conn, rows=[(first, first, "stop"), (done, first, "stop"), (waiting, first, "stop")]
        )
        queries.steps_insert_many(conn, rows=[(other, other, "stop")])
        found = queries.open_of_workflow(conn, workflow_id=first)
        assert found == [(first, first), (waiting, waiting), (retry, done)]
        ids = [row for row, _ in found]
        assert queries.cancel_open(conn, ids=[*ids, other + 10**6], message="x") == ids
        assert queries.cancel_open(conn, ids=ids, message="x") == []
        queries.steps_cancelled(conn, step_ids=[first])
    every = sorted([*ids, other])
    statuses = dict(zip(every, [row[0] for row in _rows(contract, every)], strict=True))
    assert statuses == {first: "falha", waiting: "falha", retry: "falha", other: "pendente"}


def test_the_operators_view_reads_a_workflows_steps_edges_and_rows(contract: Contract) -> None:
    """``adapter.workflow_view`` (ops/workflow_view.py builds status
    --workflow on it): the steps by id, the edges by child and position,
    the steps' task rows with the step each belongs to, and the rows a dead
    chain's later runs link by ``live_id``; nothing for an unknown id."""
    queries, view = contract.adapter.workflow, contract.adapter.workflow_view
    with contract.engine.begin() as conn:
        a, b = contract.insert(conn), contract.insert(conn)
        [c] = _waiting(contract, conn, 1)
        queries.steps_insert_many(conn, rows=[(step, a, "stop") for step in (a, b, c)])
        queries.edges_insert_many(conn, rows=[(c, b, 0), (c, a, 1)])
        queries.results_write(conn, results=[(a, '{"a":1}')])
        later = contract.insert(conn)  # b's dead-letter run: linked by live_id
        table = contract.adapter.table
        conn.execute(update(table).where(table.c.id == later).values(live_id=b, dead=True))
    with contract.engine.connect() as conn:
        steps = view.steps_of(conn, workflow_id=a)
        assert [(s.step_id, s.on_failure, s.result) for s in steps] == [
            (a, "stop", '{"a":1}'),
            (b, "stop", None),
            (c, "stop", None),
        ]
        assert [tuple(e) for e in view.edges_of(conn, workflow_id=a)] == [(c, b, 0), (c, a, 1)]
        rows = view.rows_of(conn, workflow_id=a)
        assert [(r.step, r.id, r.status) for r in rows] == [
            (a, a, "pendente"),
            (b, b, "pendente"),
            (b, later, "pendente"),  # by its live_id
            (c, c, "agendada"),
        ]
        assert [(r.step, r.id) for r in view.rows_linked(conn, heads=[b, 10**9])] == [(b, later)]
        assert view.steps_of(conn, workflow_id=10**9) == []
        assert view.edges_of(conn, workflow_id=10**9) == []
        assert view.rows_of(conn, workflow_id=10**9) == []
