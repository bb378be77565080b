"""The statements of workflows (``adapter.workflow``): the steps and edges
tables beside a queue table (``schema.mixins.workflow_tables``) and the
task rows they release or cancel.

A waiting step is a task row ``agendada`` with ``data_hora`` NULL: the
schedule routine promotes only rows whose time has come, and the claim
takes only ``pendente`` rows, so nothing but :meth:`WorkflowQueries.release`
makes it ready. The release and the cancellation are guarded by that
state, so each happens at most once, whoever tries.

The order that makes "released once, after every parent committed" hold is
the manager's (docs/workflows.md): lock the children's task rows
(:meth:`lock_tasks`), then mark the edges done, then count the edges left
with a locking read (:meth:`still_waiting`), which sees what the
transactions that held those locks before committed, under READ COMMITTED
and InnoDB's REPEATABLE READ alike (a plain read there would use the
transaction's first snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    bindparam,
    false,
    insert,
    inspect,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from ..schema.mixins import STEP_CANCELLED, Status, status_is, workflow_tables

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["WorkflowQueries"]

_WAITING = (Status.PENDING, Status.SCHEDULED)


class WorkflowQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        tables = workflow_tables(table)
        self.steps, self.edges = steps, edges = tables.steps, tables.edges
        c, s, e = table.c, steps.c, edges.c
        ids = adapter.id_match
        scheduled = status_is(c.status, Status.SCHEDULED)
        waiting = (scheduled, c.data_hora.is_(None))
        self._wait = update(table).where(ids(c.id, "ids"), scheduled).values(data_hora=None)
        self._children = select(e.parent_id, e.child_id).where(ids(e.parent_id, "ids"))
        self._write_result = (
            update(steps)
            .where(s.step_id == bindparam("b_step"))
            .values(result=bindparam("b_result"))
        )
        self._lock = select(c.id).where(ids(c.id, "ids")).order_by(c.id).with_for_update()
        self._done = update(edges).where(ids(e.parent_id, "ids")).values(done=True)
        # a locking read: the latest committed edges, not a snapshot's
        self._left = (
            select(e.child_id)
            .where(ids(e.child_id, "ids"), e.done == false())
            .with_for_update(read=True)
        )
        self._release = (
            update(table)
            .where(ids(c.id, "ids"), *waiting)
            .values(status=Status.PENDING.value, data_hora=adapter.clock())
        )
        cancel = {
            "status": Status.FAILED.value,
            "estouro_tentativas": False,
            "reenfileirado": False,
            "mensagem": bindparam("b_message"),
            "finished_at": adapter.clock(),
        }
        one = c.id == bindparam("b_id")
        self._cancel_waiting = update(table).where(one, *waiting).values(**cancel)
        self._cancel_open = (
            update(table).where(one, status_is(c.status, *_WAITING)).values(**cancel)
        )
        self._mark = update(steps).where(ids(s.step_id, "ids")).values(state=STEP_CANCELLED)
        self._step = select(s.workflow_id, s.on_failure).where(s.step_id == bindparam("step"))
        self._edges_of = (
            select(e.parent_id, e.child_id)
            .join(steps, s.step_id == e.child_id)
            .where(s.workflow_id == bindparam("workflow"))
        )
        self._parents = (
            select(s.result)
            .select_from(edges.join(steps, s.step_id == e.parent_id))
            .where(e.child_id == bindparam("step"))
            .order_by(e.position)
        )
        in_workflow = s.workflow_id == bindparam("workflow")
        open_ = status_is(c.status, *_WAITING)
        self._open_of_workflow = union_all(
            *(
                select(c.id, s.step_id).join(steps, column == s.step_id).where(in_workflow, open_)
                for column in (c.id, c.id_inicial)
            )
        )
        self._steps_of_workflow = select(s.step_id).where(in_workflow).order_by(s.step_id)
        # what a worker does to the tables, on no row: refused without the rights
        self._probes = (
            select(e.child_id).where(false()),
            update(edges).where(false()).values(done=e.done),
            select(s.step_id).where(false()),
            update(steps).where(false()).values(state=s.state),
        )

    def _each_chunk(self, conn: Connection, statement: Any, ids: Iterable[int]) -> Iterator[Any]:
        """``statement`` run on ``ids`` (sorted, without repeats) a chunk
        at a time (``id_chunks``); each result."""
        for chunk in self.adapter.id_chunks(sorted(set(ids))):
            yield conn.execute(statement, {"ids": chunk})

    # ------------------------------------------------------------ enqueue
    def tables_exist(self, conn: Connection) -> bool:
        """Whether the database has both workflow tables (a queue made
        before them has not; its worker then skips every statement here)."""
        try:
            found = inspect(conn)
            return all(
                found.has_table(table.name, schema=table.schema)
                for table in (self.steps, self.edges)
            )
        except SQLAlchemyError:
            return False

    def tables_probe(self, conn: Connection) -> None:
        """Read and update both workflow tables, touching no row: raises
        the database's error when this role lacks the rights a worker
        needs there (a role granted the queue table only)."""
        for statement in self._probes:
            conn.execute(statement)

    def steps_insert_many(self, conn: Connection, *, rows: Sequence[tuple[int, int, str]]) -> None:
        """Insert steps: (step_id, workflow_id, on_failure) each."""
        if rows:
            conn.execute(
                insert(self.steps),
                [{"step_id": s, "workflow_id": w, "on_failure": f} for s, w, f in rows],
            )

    def edges_insert_many(self, conn: Connection, *, rows: Sequence[tuple[int, int, int]]) -> None:
        """Insert edges: (child_id, parent_id, position) each, not done."""
        if rows:
            conn.execute(
                insert(self.edges),
                [{"child_id": c, "parent_id": p, "position": n, "done": False} for c, p, n in rows],
            )

    def task_wait_many(self, conn: Connection, *, ids: Sequence[int]) -> int:
        """Make the new ``agendada`` rows ``ids`` wait for their parents
        (``data_hora`` NULL: no time yet); how many were."""
        return sum(result.rowcount for result in self._each_chunk(conn, self._wait, ids))

    # ------------------------------------------------------------ completion
    def children_of(self, conn: Connection, *, parents: Iterable[int]) -> list[tuple[int, int]]:
        """(parent, child) of every edge from ``parents`` (step ids)."""
        return [
            (int(p), int(c))
            for result in self._each_chunk(conn, self._children, parents)
            for p, c in result
        ]

    def results_write(self, conn: Connection, *, results: Sequence[tuple[int, str | None]]) -> None:
        """Store each (step_id, result as JSON or None)."""
        if results:
            conn.execute(self._write_result, [{"b_step": s, "b_result": r} for s, r in results])

    def lock_tasks(self, conn: Connection, *, ids: Sequence[int]) -> None:
        """Lock the task rows ``ids`` until the transaction ends, in id
        order (two completions that share children never deadlock on them).
        SQLite's writing transaction holds the database's write lock already."""
        for result in self._each_chunk(conn, self._lock, ids):
            result.all()

    def edges_done(self, conn: Connection, *, parents: Sequence[int]) -> None:
        """Mark every edge from ``parents`` done."""
        for _ in self._each_chunk(conn, self._done, parents):
            pass

    def still_waiting(self, conn: Connection, *, children: Sequence[int]) -> set[int]:
        """Which of ``children`` have an edge not done (a locking read)."""
        return {
            int(child)
            for result in self._each_chunk(conn, self._left, children)
            for child in result.scalars()
        }

    def release(self, conn: Connection, *, ids: Sequence[int]) -> int:
        """Make the waiting steps ``ids`` ready now (``pendente``,
        ``data_hora`` the database's clock); those not waiting any more
        (released, cancelled) are left alone. How many were released."""
        return sum(result.rowcount for result in self._each_chunk(conn, self._release, ids))

    # ------------------------------------------------------------ failure
    def step_of(self, conn: Connection, *, step_id: int) -> tuple[int, str] | None:
        """(workflow_id, on_failure) of step ``step_id``; None: not a step."""
        row = conn.execute(self._step, {"step": step_id}).first()
        return None if row is None else (int(row[0]), str(row[1]))

    def edges_of_workflow(self, conn: Connection, *, workflow_id: int) -> list[tuple[int, int]]:
        """(parent, child) of every edge of the workflow."""
        rows = conn.execute(self._edges_of, {"workflow": workflow_id})
        return [(int(p), int(c)) for p, c in rows]

    def cancel_waiting(self, conn: Connection, *, ids: Sequence[int], message: str) -> list[int]:
        """Cancel the steps among ``ids`` still waiting for their parents
        (``falha`` with ``message``, as an operator's cancel writes it), and
        mark their steps cancelled; the ids cancelled."""
        cancelled = self._cancel_each(conn, self._cancel_waiting, ids, message)
        self.steps_cancelled(conn, step_ids=cancelled)
        return cancelled

    def open_of_workflow(self, conn: Connection, *, workflow_id: int) -> list[tuple[int, int]]:
        """(task row id, step id) of every ``pendente`` or ``agendada`` row
        of the workflow's steps: first attempts, and retries waiting out
        their backoff."""
        rows = conn.execute(self._open_of_workflow, {"workflow": workflow_id})
        return sorted((int(row[0]), int(row[1])) for row in rows)

    def cancel_open(self, conn: Connection, *, ids: Sequence[int], message: str) -> list[int]:
        """Cancel the rows among ``ids`` still ``pendente`` or ``agendada``
        (a worker's claim may have won meanwhile); the ids cancelled."""
        return self._cancel_each(conn, self._cancel_open, ids, message)

    def steps_cancelled(self, conn: Connection, *, step_ids: Sequence[int]) -> None:
        """Mark the steps ``step_ids`` cancelled."""
        for _ in self._each_chunk(conn, self._mark, step_ids):
            pass

    def steps_of_workflow(self, conn: Connection, *, workflow_id: int) -> list[int]:
        """The step ids of the workflow, in order (empty: no such workflow)."""
        rows = conn.execute(self._steps_of_workflow, {"workflow": workflow_id})
        return [int(step) for step in rows.scalars()]

    @staticmethod
    def _cancel_each(
        conn: Connection, statement: Any, ids: Sequence[int], message: str
    ) -> list[int]:
        # one row a statement: which rows changed, without RETURNING (MariaDB
        # has none on UPDATE)
        return [
            task_id
            for task_id in sorted(set(ids))
            if conn.execute(statement, {"b_id": task_id, "b_message": message}).rowcount
        ]

    # ------------------------------------------------------------ reading
    def parent_results(self, conn: Connection, *, step_id: int) -> list[str | None]:
        """The stored results (JSON text, or None) of step ``step_id``'s
        parents, in their order; empty for a task that is not a step."""
        return list(conn.execute(self._parents, {"step": step_id}).scalars())
