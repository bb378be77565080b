"""``adapter.workflow_view.workflow_of`` (adapters/workflow_view.py), on
every database of the ``contract`` fixture: the workflow of a task's
chain, which the dashboard's task page links to."""

from __future__ import annotations

from sqlalchemy import insert

from sqla_queue.schema.mixins import workflow_tables
from tests.adapters.conftest import Contract


def test_workflow_of_finds_a_steps_workflow_and_nothing_for_other_tasks(
    contract: Contract,
) -> None:
    view = contract.adapter.workflow_view
    steps = workflow_tables(contract.adapter.table).steps
    with contract.engine.begin() as conn:
        first, second, plain = (contract.insert(conn) for _ in range(3))
        conn.execute(
            insert(steps),
            [
                {"step_id": step, "workflow_id": first, "on_failure": "stop"}
                for step in (first, second)
            ],
        )
    with contract.engine.connect() as conn:
        assert view.workflow_of(conn, step_id=second) == first
        assert view.workflow_of(conn, step_id=first) == first
        assert view.workflow_of(conn, step_id=plain) is None


def test_workflow_of_on_a_database_without_the_workflow_tables(contract: Contract) -> None:
    """A queue made before workflows: None, from the catalogue alone (a
    statement on the missing table would fail, and on PostgreSQL spoil the
    transaction it ran in)."""
    tables = workflow_tables(contract.adapter.table)
    made = [tables.edges, tables.steps]
    for table in made:
        table.drop(contract.engine)
    try:
        with contract.engine.begin() as conn:
            task = contract.insert(conn)
            assert contract.adapter.workflow_view.workflow_of(conn, step_id=task) is None
            assert contract.insert(conn) > task  # the transaction goes on
    finally:
        for table in reversed(made):
            table.create(contract.engine)
