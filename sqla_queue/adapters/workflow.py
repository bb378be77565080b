"""The statements of workflows (``adapter.workflow``): the steps and edges
tables beside a queue table (``schema.mixins.workflow_tables``) and the
task rows they release or cancel.

A waiting step is a task row ``agendada`` with ``data_hora`` NULL: the
schedule routine promotes only rows whose time has come, and the claim
takes only ``pendente`` rows, so nothing but :meth:`WorkflowQueries.release`
makes it ready. The release and the cancellation are guarded by that
state, so each happens at most once, whoever tries.

A child waits on gates (``<queue>_wf_gates``): counts of the parents not
done yet. Its parents' completions lock the gates they open with a locking
read (:meth:`gates_lock`, in key order), which sees the latest committed
count under READ COMMITTED and InnoDB's REPEATABLE READ alike, and take
their share off (:meth:`gates_take`): the transaction that brings a gate
to 0 is the only one that sees it there, and it has seen every other
parent's commit (docs/workflows.md, "The guarantee").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    bindparam,
    false,
    func,
    inspect,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from ..schema.mixins import (
    STEP_CANCELLED,
    STEP_COMPENSATION,
    STEP_DEAD,
    Status,
    status_is,
    workflow_tables,
)
from ..schema.rows import STEP_MESSAGE

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["WorkflowQueries", "tables_present"]

_WAITING = (Status.PENDING, Status.SCHEDULED)
#: gate keys per statement: an IN list of row values short enough for an
#: index look-up on every database (see ``id_chunks``)
_KEYS_MAX = 500
#: gates_count_down takes up to this many gates one UPDATE ... RETURNING each
_ONE_BY_ONE = 4


def tables_present(conn: Connection, tables: Iterable[Table]) -> bool:
    """Whether the database has every one of ``tables`` (a catalog read;
    False where even that read fails)."""
    try:
        found = inspect(conn)
        return all(found.has_table(table.name, schema=table.schema) for table in tables)
    except SQLAlchemyError:
        return False


class WorkflowQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        tables = workflow_tables(table)
        steps, edges, gates = tables.steps, tables.edges, tables.gates
        self.steps, self.edges, self.gates = steps, edges, gates
        c, s, e, g = table.c, steps.c, edges.c, gates.c
        ids = adapter.id_match
        scheduled = status_is(c.status, Status.SCHEDULED)
        waiting = (scheduled, c.data_hora.is_(None))
        self._wait = update(table).where(ids(c.id, "ids"), scheduled).values(data_hora=None)
        self._children = select(e.parent_id, e.child_id, e.slot).where(
            ids(e.parent_id, "ids"), e.done == false()
        )
        self._write_result = (
            update(steps)
            .where(s.step_id == bindparam("b_step"))
            .values(result=bindparam("b_result"))
        )
        self._done = update(edges).where(ids(e.parent_id, "ids")).values(done=True)
        keys = tuple_(g.owner_id, g.slot).in_(bindparam("keys", expanding=True))
        # a locking read, in key order: the latest committed counts, not a
        # snapshot's; two completions that share gates never deadlock on them
        self._gates_lock = (
            select(g.owner_id, g.slot, g.waiting)
            .where(keys)
            .order_by(g.owner_id, g.slot)
            .with_for_update()
        )
        self._gates_take = update(gates).where(keys).values(waiting=g.waiting - bindparam("n"))
        # one gate where an UPDATE returns: the write locks the row and
        # counts down its latest committed count (PostgreSQL's READ
        # COMMITTED applies it to the version a concurrent commit left)
        self._gate_take = (
            update(gates)
            .where(g.owner_id == bindparam("b_owner"), g.slot == bindparam("b_slot"))
            .values(waiting=g.waiting - bindparam("b_n"))
            .returning(g.waiting)
        )
        end = and_(g.owner_id == -bindparam("workflow"), g.slot == 0)
        self._finish = (
            update(gates).where(end, g.outcome.is_(None)).values(outcome=bindparam("outcome"))
        )
        self._reopen = update(gates).where(end).values(outcome=None)
        self._outcome = select(g.outcome).where(end)
        self._dead_steps = select(func.count()).where(
            s.workflow_id == bindparam("workflow"), s.state == STEP_DEAD
        )
        self._compensations = select(s.step_id).where(
            s.workflow_id == bindparam("workflow"), s.state == STEP_COMPENSATION
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
        self._reinstate_one = (
            update(table)
            .where(
                one,
                status_is(c.status, Status.FAILED),
                c.mensagem == bindparam("b_message"),
            )
            .values(
                status=Status.SCHEDULED.value,
                data_hora=None,
                mensagem=STEP_MESSAGE,
                finished_at=None,
            )
        )
        self._mark_rows = update(table).where(ids(c.id, "ids")).values(mensagem=STEP_MESSAGE)
        self._cancel_waiting = update(table).where(one, *waiting).values(**cancel)
        self._cancel_open = (
            update(table).where(one, status_is(c.status, *_WAITING)).values(**cancel)
        )
        self._mark = update(steps).where(ids(s.step_id, "ids")).values(state=bindparam("b_state"))
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
            select(g.owner_id).where(false()),
            update(gates).where(false()).values(waiting=g.waiting),
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
        return tables_present(conn, (self.steps, self.edges, self.gates))

    def tables_probe(self, conn: Connection) -> None:
        """Read and update both workflow tables, touching no row: raises
        the database's error when this role lacks the rights a worker
        needs there (a role granted the queue table only)."""
        for statement in self._probes:
            conn.execute(statement)

    def steps_insert_many(self, conn: Connection, *, rows: Sequence[tuple[int, int, str]]) -> None:
        """Insert steps: (step_id, workflow_id, on_failure) each."""
        self.adapter.rows_insert_many(
            conn,
            self.steps,
            [
                {"step_id": s, "workflow_id": w, "on_failure": f, "result": None, "state": None}
                for s, w, f in rows
            ],
        )

    def edges_insert_many(
        self, conn: Connection, *, rows: Sequence[tuple[int, int, int, int]]
    ) -> None:
        """Insert edges: (child_id, parent_id, position, slot) each, not done."""
        self.adapter.rows_insert_many(
            conn,
            self.edges,
            [
                {"child_id": c, "parent_id": p, "position": n, "slot": g, "done": False}
                for c, p, n, g in rows
            ],
        )

    def gates_insert_many(self, conn: Connection, *, rows: Sequence[tuple[int, int, int]]) -> None:
        """Insert gates: (owner_id, slot, waiting) each."""
        self.adapter.rows_insert_many(
            conn,
            self.gates,
            [{"owner_id": o, "slot": g, "waiting": n, "outcome": None} for o, g, n in rows],
        )

    def task_wait_many(self, conn: Connection, *, ids: Sequence[int]) -> int:
        """Make the new ``agendada`` rows ``ids`` wait for their parents
        (``data_hora`` NULL: no time yet); how many were."""
        return sum(result.rowcount for result in self._each_chunk(conn, self._wait, ids))

    # ------------------------------------------------------------ completion
    def children_of(
        self, conn: Connection, *, parents: Iterable[int]
    ) -> list[tuple[int, int, int]]:
        """(parent, child, slot) of every edge from ``parents`` (step ids)
        not done yet: the child's gate each one opens."""
        return [
            (int(p), int(c), int(g))
            for result in self._each_chunk(conn, self._children, parents)
            for p, c, g in result
        ]

    def results_write(self, conn: Connection, *, results: Sequence[tuple[int, str]]) -> None:
        """Store each (step_id, result as JSON)."""
        if results:
            conn.execute(self._write_result, [{"b_step": s, "b_result": r} for s, r in results])

    def edges_done(self, conn: Connection, *, parents: Sequence[int]) -> None:
        """Mark every edge from ``parents`` done."""
        for _ in self._each_chunk(conn, self._done, parents):
            pass

    def gates_lock(
        self, conn: Connection, *, keys: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        """Lock the gates ``keys`` ((owner, slot) each) until the
        transaction ends, in key order; their latest committed counts.
        SQLite's writing transaction holds the database's write lock already."""
        found: dict[tuple[int, int], int] = {}
        ordered = sorted(set(keys))
        for at in range(0, len(ordered), _KEYS_MAX):
            rows = conn.execute(self._gates_lock, {"keys": ordered[at : at + _KEYS_MAX]})
            found.update(((int(o), int(g)), int(n)) for o, g, n in rows)
        return found

    def gates_take(self, conn: Connection, *, amounts: dict[tuple[int, int], int]) -> None:
        """Take ``amounts`` off the gates (locked by :meth:`gates_lock`):
        one statement per distinct amount."""
        by_amount: dict[int, list[tuple[int, int]]] = {}
        for key, n in sorted(amounts.items()):
            by_amount.setdefault(n, []).append(key)
        for n, keys in by_amount.items():
            for at in range(0, len(keys), _KEYS_MAX):
                conn.execute(self._gates_take, {"keys": keys[at : at + _KEYS_MAX], "n": n})

    def gates_count_down(
        self, conn: Connection, *, amounts: dict[tuple[int, int], int]
    ) -> dict[tuple[int, int], int]:
        """Take ``amounts`` off their gates ((owner, slot) -> n), each
        locked until the transaction ends, in key order, and counted down
        from its latest committed count; what each gate has left (a gate
        that does not exist is left out). Where the dialect returns from an
        UPDATE and the gates are few (a batch's completions open one or
        two), one ``UPDATE ... RETURNING`` per gate in key order (PostgreSQL's
        READ COMMITTED applies it to the version a concurrent commit left);
        else :meth:`gates_lock`, then :meth:`gates_take`."""
        if conn.dialect.update_returning and len(amounts) <= _ONE_BY_ONE:
            left = {}
            for (owner, slot), n in sorted(amounts.items()):
                values = {"b_owner": owner, "b_slot": slot, "b_n": n}
                row = conn.execute(self._gate_take, values).first()
                if row is not None:
                    left[(owner, slot)] = int(row[0])
            return left
        waiting = self.gates_lock(conn, keys=list(amounts))
        self.gates_take(conn, amounts=amounts)
        return {gate: waiting[gate] - n for gate, n in amounts.items() if gate in waiting}

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

    def cancel_waiting(
        self, conn: Connection, *, ids: Sequence[int], message: str, mark: bool = True
    ) -> list[int]:
        """Cancel the steps among ``ids`` still waiting for their parents
        (``falha`` with ``message``, as an operator's cancel writes it), and
        mark their steps cancelled (``mark``: a compensation step keeps its
        mark); the ids cancelled."""
        cancelled = self._cancel_each(conn, self._cancel_waiting, ids, message)
        if mark:
            self.steps_mark(conn, step_ids=cancelled, state=STEP_CANCELLED)
        return cancelled

    def finish(self, conn: Connection, *, workflow_id: int, outcome: str) -> bool:
        """Write the workflow's outcome, unless it has one; whether this did."""
        changed = conn.execute(self._finish, {"workflow": workflow_id, "outcome": outcome})
        return bool(changed.rowcount)

    def reopen(self, conn: Connection, *, workflow_id: int) -> None:
        """Forget the workflow's outcome (a failed step was requeued)."""
        conn.execute(self._reopen, {"workflow": workflow_id})

    def outcome_of(self, conn: Connection, *, workflow_id: int) -> str | None:
        """The workflow's outcome; None while it runs (or made before gates)."""
        return conn.execute(self._outcome, {"workflow": workflow_id}).scalar()

    def dead_steps(self, conn: Connection, *, workflow_id: int) -> int:
        """How many of the workflow's steps went to the dead letter."""
        return int(conn.execute(self._dead_steps, {"workflow": workflow_id}).scalar_one())

    def compensations_of(self, conn: Connection, *, workflow_id: int) -> list[int]:
        """The workflow's compensation steps."""
        rows = conn.execute(self._compensations, {"workflow": workflow_id})
        return sorted(int(step) for step in rows.scalars())

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

    def reinstate(self, conn: Connection, *, ids: Sequence[int], message: str) -> list[int]:
        """Make the steps among ``ids`` cancelled with ``message`` wait for
        their parents again (a requeue resumes their workflow); the ids."""
        return self._cancel_each(conn, self._reinstate_one, ids, message)

    def task_mark_steps(self, conn: Connection, *, ids: Sequence[int]) -> None:
        """Mark the task rows ``ids`` as steps whose completion opens gates
        (``mensagem`` = ``STEP_MESSAGE``): a chain requeued from the dead letter."""
        for _ in self._each_chunk(conn, self._mark_rows, ids):
            pass

    def steps_mark(self, conn: Connection, *, step_ids: Sequence[int], state: str | None) -> None:
        """Set the steps ``step_ids``'s ``state`` (cancelled, dead_letter;
        None: running again)."""
        for chunk in self.adapter.id_chunks(sorted(set(step_ids))):
            conn.execute(self._mark, {"ids": chunk, "b_state": state})

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
