"""The statements that read a workflow for an operator (``adapter.workflow_view``:
``sqla-queue status --workflow``, the dashboard's workflow page,
:mod:`sqla_queue.ops.workflow_view`): its steps, its edges, and the task
rows each step's state is read from.

A step is a chain (``schema.mixins.workflow_tables``): its rows are the
one whose id is the step's and its retries (``id_inicial``), and the
dead-letter runs and requeued chains that name it as ``live_id`` (with
their retries, which carry it too). One statement per index reads them
all for a workflow: the steps' index on ``workflow_id``, then the queue
table's primary key, ``ix_inicial`` and ``ix_live``. Only the columns a
state needs are read (no payload, no traceback), so a group of 10,000
steps costs 10,000 short rows. Everything here reads; nothing locks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, case, inspect, select, union_all

from ..schema.mixins import workflow_tables
from .inspection import cancelled_attempt

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["WorkflowViewQueries"]


class WorkflowViewQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        tables = workflow_tables(table)
        c, s, e = table.c, tables.steps.c, tables.edges.c
        in_workflow = s.workflow_id == bindparam("workflow")
        self._steps = (
            select(s.step_id, s.on_failure, s.state, s.result)
            .where(in_workflow)
            .order_by(s.step_id)
        )
        self._edges = (
            select(e.child_id, e.parent_id, e.position)
            .join(tables.steps, s.step_id == e.child_id)
            .where(in_workflow)
            .order_by(e.child_id, e.position)
        )
        columns = (
            c.id,
            c.id_inicial,
            c.live_id,
            c.dead,
            c.status,
            c.tentativa,
            c.reenfileirado,
            case((cancelled_attempt(c), 1), else_=0).label("cancelled"),
            c.processo,
            c.data_hora,
        )
        self._rows = union_all(
            *(
                select(s.step_id.label("step"), *columns)
                .select_from(table.join(tables.steps, link == s.step_id))
                .where(in_workflow)
                for link in (c.id, c.id_inicial, c.live_id)
            )
        )
        self._linked = select(c.live_id.label("step"), *columns).where(
            adapter.id_match(c.live_id, "ids")
        )
        self._steps_table = tables.steps
        self._workflow_of = select(s.workflow_id).where(s.step_id == bindparam("step"))

    def steps_of(self, conn: Connection, *, workflow_id: int) -> list[Any]:
        """(step_id, on_failure, state, result) of each step of the
        workflow, by step id; empty: no such workflow."""
        return list(conn.execute(self._steps, {"workflow": workflow_id}))

    def edges_of(self, conn: Connection, *, workflow_id: int) -> list[Any]:
        """(child_id, parent_id, position) of each edge of the workflow, by
        child and position."""
        return list(conn.execute(self._edges, {"workflow": workflow_id}))

    def rows_of(self, conn: Connection, *, workflow_id: int) -> list[Any]:
        """The task rows of the workflow's steps (``step``: the step each
        belongs to; id, id_inicial, live_id, dead, status, tentativa,
        reenfileirado, cancelled as 1 or 0, processo, data_hora), by id."""
        rows = conn.execute(self._rows, {"workflow": workflow_id})
        return sorted(rows, key=lambda row: (row.step, row.id))

    def workflow_of(self, conn: Connection, *, step_id: int) -> int | None:
        """The workflow whose step ``step_id`` is (a task's chain: the
        dashboard's task page links to it); None for a task that is no
        step, and on a database without the workflow tables (a queue made
        before them), where it reads the catalogue only."""
        steps = self._steps_table
        if not inspect(conn).has_table(steps.name, schema=steps.schema):
            return None
        found = conn.execute(self._workflow_of, {"step": step_id}).scalar()
        return None if found is None else int(found)

    def rows_linked(self, conn: Connection, *, heads: Iterable[int]) -> list[Any]:
        """The rows whose ``live_id`` is one of ``heads`` (``step``: that
        head): what a requeued chain's own dead-letter run and its requeue
        name (``dead_letter_row`` links to the chain that died, not to the
        step), by id."""
        found = [
            row
            for chunk in self.adapter.id_chunks(sorted(set(heads)))
            for row in conn.execute(self._linked, {"ids": chunk})
        ]
        return sorted(found, key=lambda row: row.id)
