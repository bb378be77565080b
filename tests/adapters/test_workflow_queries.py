"""The conformance suite of ``adapter.workflow`` (adapters/workflow.py), on
every database of the ``contract`` fixture: what the manager's release of
workflow steps (batch/workflow.py) relies on."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, select, update

from sqla_queue.common.types import utcnow
from sqla_queue.schema.rows import CANCELLED_MESSAGE, STEP_MESSAGE
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
        queries.edges_insert_many(conn, rows=[(c, b, 0, 0), (c, a, 1, 0)])
        queries.results_write(conn, results=[(a, '{"a":1}')])
    with contract.engine.connect() as conn:
        assert sorted(queries.children_of(conn, parents=[a, b, 10**9])) == [(a, c, 0), (b, c, 0)]
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


def test_the_gate_locked_after_the_other_parents_commit_reads_its_count(
    contract: Contract,
) -> None:
    """Two parents of one child complete in two transactions: the second,
    whose snapshot predates the first's commit, locks the child's gate and
    reads the count the first committed (a locking read: InnoDB's plain
    read would give its snapshot's 2), so it brings it to 0 and releases
    the child; its edges read as done afterwards. SQLite has one writer at
    a time: the interleaving cannot happen there."""
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        a, b = contract.insert(conn), contract.insert(conn)
        [child] = _waiting(contract, conn, 1)
        queries.steps_insert_many(conn, rows=[(step, a, "stop") for step in (a, b, child)])
        queries.edges_insert_many(conn, rows=[(child, a, 0, 0), (child, b, 1, 0)])
        queries.gates_insert_many(conn, rows=[(child, 0, 2)])
    if contract.adapter.single_writer:
        with contract.engine.begin() as conn:
            assert queries.gates_lock(conn, keys=[(child, 0)]) == {(child, 0): 2}
            queries.gates_take(conn, amounts={(child, 0): 2})
            assert queries.gates_lock(conn, keys=[(child, 0)]) == {(child, 0): 0}
        return
    with contract.engine.connect() as first, contract.engine.connect() as second:
        first.begin()
        assert queries.gates_lock(first, keys=[(child, 0)]) == {(child, 0): 2}
        queries.gates_take(first, amounts={(child, 0): 1})
        queries.edges_done(first, parents=[a])
        second.begin()
        assert queries.children_of(second, parents=[a, b])  # its snapshot: before the commit
        first.commit()
        assert queries.gates_lock(second, keys=[(child, 0)]) == {(child, 0): 1}
        queries.gates_take(second, amounts={(child, 0): 1})
        queries.edges_done(second, parents=[b])
        assert queries.release(second, ids=[child]) == 1
        second.commit()
    assert _rows(contract, [child])[0][0] == "pendente"
    with contract.engine.connect() as conn:
        assert queries.children_of(conn, parents=[a, b]) == []  # done: not read again


def test_gates_are_counted_down_from_the_counts_the_other_parents_committed(
    contract: Contract,
) -> None:
    """``gates_count_down`` (one UPDATE ... RETURNING a gate where the
    dialect has it and the gates are few, else a locking read and the
    takes) counts down the latest committed counts, not the snapshot's,
    and leaves a missing gate out."""
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        [child] = _waiting(contract, conn, 1)
        queries.gates_insert_many(conn, rows=[(child, 0, 2), (child, 1, 3)])
        assert queries.gates_count_down(conn, amounts={(child, 7): 1}) == {}  # no such gate
    both = {(child, 0): 1, (child, 1): 1}
    if contract.adapter.single_writer:
        with contract.engine.begin() as conn:
            assert queries.gates_count_down(conn, amounts=both) == {(child, 0): 1, (child, 1): 2}
        with contract.engine.begin() as conn:
            assert queries.gates_count_down(conn, amounts={(child, 0): 1}) == {(child, 0): 0}
        return
    with contract.engine.connect() as first, contract.engine.connect() as second:
        first.begin()
        assert queries.gates_count_down(first, amounts=both) == {(child, 0): 1, (child, 1): 2}
        second.begin()
        assert queries.children_of(second, parents=[child]) == []  # its snapshot begins
        first.commit()
        assert queries.gates_count_down(second, amounts={(child, 0): 1}) == {(child, 0): 0}
        # many gates: the locking read and the takes, from the latest counts too
        many = {(child, 1): 2, **{(child, 7 + k): 1 for k in range(8)}}
        assert queries.gates_count_down(second, amounts=many) == {(child, 1): 0}
        second.commit()
    with contract.engine.connect() as conn:
        found = queries.gates_lock(conn, keys=[(child, 0), (child, 1)])
    assert found == {(child, 0): 0, (child, 1): 0}


def test_gates_count_down_by_amount_in_chunks(contract: Contract) -> None:
    """Many gates at once (more than one statement's worth of keys), two
    amounts; unknown keys are left out of the counts."""
    queries = contract.adapter.workflow
    owners = list(range(10**6, 10**6 + 1200))
    with contract.engine.begin() as conn:
        queries.gates_insert_many(conn, rows=[(o, 1 + o % 2, 5) for o in owners])
        queries.gates_take(conn, amounts={(o, 1 + o % 2): 1 + o % 2 for o in owners})
        found = queries.gates_lock(conn, keys=[(o, 1 + o % 2) for o in owners] + [(1, 9)])
    assert found == {(o, 1 + o % 2): 4 - o % 2 for o in owners}


def test_a_workflows_outcome_is_written_once_and_reopened(contract: Contract) -> None:
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        a, b, comp = contract.insert(conn), contract.insert(conn), contract.insert(conn)
        queries.steps_insert_many(conn, rows=[(s, a, "compensate") for s in (a, b, comp)])
        queries.gates_insert_many(conn, rows=[(-a, 0, 1)])
        queries.steps_mark(conn, step_ids=[comp], state="compensation")
        queries.steps_mark(conn, step_ids=[b], state="dead_letter")
        assert queries.outcome_of(conn, workflow_id=a) is None
        assert queries.finish(conn, workflow_id=a, outcome="failed")
        assert not queries.finish(conn, workflow_id=a, outcome="succeeded")
        assert queries.outcome_of(conn, workflow_id=a) == "failed"
        assert queries.dead_steps(conn, workflow_id=a) == 1
        assert queries.compensations_of(conn, workflow_id=a) == [comp]
        queries.reopen(conn, workflow_id=a)
        assert queries.outcome_of(conn, workflow_id=a) is None
        assert queries.outcome_of(conn, workflow_id=10**9) is None


def test_a_stopped_step_waits_again_and_a_requeued_row_is_marked(contract: Contract) -> None:
    """``reinstate``: only rows cancelled with the given message go back to
    waiting (marked as steps, no time, no end); ``task_mark_steps`` marks a
    new row."""
    queries = contract.adapter.workflow
    with contract.engine.begin() as conn:
        stopped, operator = _waiting(contract, conn, 2)
        queries.cancel_waiting(conn, ids=[stopped], message="stopped")
        queries.cancel_waiting(conn, ids=[operator], message=CANCELLED_MESSAGE)
        assert queries.reinstate(conn, ids=[stopped, operator], message="stopped") == [stopped]
        fresh = contract.insert(conn)
        queries.task_mark_steps(conn, ids=[fresh])
    assert _rows(contract, [stopped, operator, fresh]) == [
        ("agendada", None, STEP_MESSAGE),
        ("falha", _rows(contract, [operator])[0][1], CANCELLED_MESSAGE),
        ("pendente", _rows(contract, [fresh])[0][1], STEP_MESSAGE),
    ]


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
        queries.steps_mark(conn, step_ids=[first], state="cancelled")
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
        queries.edges_insert_many(conn, rows=[(c, b, 0, 0), (c, a, 1, 0)])
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


def test_many_steps_and_edges_are_inserted_at_once(contract: Contract) -> None:
    """``rows_insert_many``: a large workflow's steps and edges (COPY on
    psycopg from COPY_THRESHOLD rows, an executemany elsewhere and below),
    every value as given."""
    queries = contract.adapter.workflow
    many = max(getattr(contract.adapter, "COPY_THRESHOLD", 0), 10) + 5
    steps = list(range(10**6, 10**6 + many))
    with contract.engine.begin() as conn:
        queries.steps_insert_many(conn, rows=[(s, steps[0], "compensate") for s in steps])
        queries.edges_insert_many(
            conn, rows=[(-steps[0], s, n, 1 + n % 3) for n, s in enumerate(steps)]
        )
        queries.gates_insert_many(conn, rows=[(-steps[0], 0, 3)])
    with contract.engine.begin() as conn:  # the adapter's own method, on any table of ours
        contract.adapter.rows_insert_many(
            conn,
            queries.gates,
            [{"owner_id": s, "slot": 0, "waiting": 1, "outcome": None} for s in steps],
        )
    with contract.engine.connect() as conn:
        assert queries.steps_of_workflow(conn, workflow_id=steps[0]) == steps
        assert queries.step_of(conn, step_id=steps[-1]) == (steps[0], "compensate")
        assert queries.gates_lock(conn, keys=[(s, 0) for s in steps]) == {(s, 0): 1 for s in steps}
        found = sorted(queries.children_of(conn, parents=steps))
        assert found == sorted((s, -steps[0], 1 + n % 3) for n, s in enumerate(steps))
        assert queries.gates_lock(conn, keys=[(-steps[0], 0)]) == {(-steps[0], 0): 3}
