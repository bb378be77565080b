"""A batch's side of workflows (docs/workflows.md): which claimed tasks are
steps with children, their results, and the release of the children in the
transaction that commits the parents' ``sucesso``.

- **At the claim** (:meth:`StepLinks.link`), one statement on the claim
  connection reads the children of the claimed steps that have some: the
  enqueue marks those with ``mensagem`` = ``STEP_MESSAGE`` (a retry
  carries it), so a claim without such a task runs no statement more than
  before workflows (one more per claim cost a fifth of the throughput at
  ``--batch-size 1``). A step's edges are written with it, in its enqueue's
  transaction, so they are known and fixed once it can be claimed; reading
  them there keeps the batch's transaction as it was for every task that
  is not a parent (a batch of one still commits its ``sucesso`` alone, in
  one round trip).
- **At the completion** (:meth:`StepLinks.advance`), on the batch's
  connection, after ``task_complete_many`` and before the commit: the
  parents' results are written, their edges marked done, and the gates
  they open counted down, barrier gates first, then the children's own
  gates (each in key order, with a locking read of the latest count): the
  transaction that brings a child's gate to 0 has seen every other
  parent's commit, and releases the child, once, in the last parent's
  transaction. A child of many parents (a group's callback) waits on one
  barrier gate per block of them, so the group's completions do not all
  queue for one row lock; the last of each block counts the child's gate
  down. Every step opens a gate: a step without children opens its
  workflow's end (owner ``-W``), whose transaction writes the outcome.
- **At the dead letter** (:meth:`StepLinks.failed`), in the failure's
  transaction: the workflow's policy cancels the step's waiting
  descendants (``stop``; ``compensate`` also releases the compensation
  step) or counts its gates down as if it had succeeded, its result None
  (``continue``).

What a transaction decided about whole workflows (an outcome) is kept on
its connection (``conn.info``) and told (logged, the hooks'
``workflow_finished``) only after its commit: :meth:`StepLinks.committed`.

A database without the workflow tables (a queue made before them) is
found at the first claim, and none of this runs there.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..adapters import Adapter, ErrorKind
from ..common.exceptions import SqlaQueueError
from ..common.redaction import describe_error
from ..policies.hooks import WORKFLOW_FINISHED, Hooks, WorkflowEvent
from ..schema.mixins import RESULT_MAX_BYTES, STEP_DEAD
from ..schema.records import TaskRecord
from ..schema.rows import NOT_NEEDED_MESSAGE, STEP_MESSAGE, STOPPED_MESSAGE

__all__ = ["StepLinks", "StepResultError", "descendants"]

#: ``conn.info`` key: the workflows a transaction finished, told at its commit
_FINISHED = "sqla_queue_workflows_finished"

logger = logging.getLogger("sqla_queue.batch.workflow")

_fix = object.__setattr__  # a TaskRecord is frozen; its private fields are ours
#: errors that say nothing of the workflow tables (the probe is made again)
_NOT_AN_ANSWER = (ErrorKind.TRANSIENT, ErrorKind.DISCONNECT)


class StepResultError(SqlaQueueError):
    """A workflow step's return value cannot be its result."""


def encode_result(value: Any) -> str:
    """A step's result as stored: JSON, at most ``RESULT_MAX_BYTES``."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepResultError(
            f"a workflow step must return a JSON value: {type(value).__name__} is not ({exc})"
        ) from None
    size = len(text.encode("utf-8"))
    if size > RESULT_MAX_BYTES:
        raise StepResultError(
            f"a workflow step's result is {size} bytes as JSON; at most {RESULT_MAX_BYTES}"
        )
    return text


class StepLinks:
    """The workflow statements a ``TaskManager`` runs, through its adapter."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        #: whether this worker can use the workflow tables (None: not asked yet)
        self.present: bool | None = None

    def check(self, conn: Connection) -> bool:
        """Whether this worker can use the workflow tables, asked once (in
        a savepoint where ``conn`` is in a transaction already)."""
        if self.present is None:
            self.present = self._usable(conn)
        return self.present

    def _usable(self, conn: Connection) -> bool:
        queries = self.adapter.workflow
        try:
            with conn.begin_nested() if conn.in_transaction() else conn.begin():
                if not queries.tables_exist(conn):
                    return False
                queries.tables_probe(conn)
        except DBAPIError as exc:
            if exc.connection_invalidated or self.adapter.classify(exc) in _NOT_AN_ANSWER:
                raise  # not an answer about the tables: asked again next time
            logger.warning(
                "the workflow tables of %s are there, but this worker's role cannot use "
                "them (%s): the steps it completes release nothing (docs/workflows.md)",
                self.adapter.table.name,
                describe_error(exc),
            )
            return False
        return True

    def link(self, conn: Connection, tasks: Sequence[TaskRecord]) -> None:
        """Note on each of ``tasks`` its step's children (one statement)."""
        parents = {
            task.step_id
            for task in tasks
            if task.step_id is not None and task.message == STEP_MESSAGE
        }
        if not parents or not self.check(conn):
            return
        if conn.in_transaction():
            edges = self.adapter.workflow.children_of(conn, parents=parents)
        else:
            with conn.begin():
                edges = self.adapter.workflow.children_of(conn, parents=parents)
        if not edges:
            return
        children: dict[int, list[tuple[int, int]]] = {}
        for parent, child, slot in edges:
            children.setdefault(parent, []).append((child, slot))
        for task in tasks:
            found = children.get(task.step_id)  # type: ignore[arg-type]
            if found:
                _fix(task, "_children", tuple(sorted(found)))

    def prepare(self, task: TaskRecord, session: Session) -> None:
        """Let ``task.parent_results()`` read on ``session`` (the handler's
        transaction)."""
        if self.present:
            _fix(task, "_parents", functools.partial(self._parent_results, task, session))

    @staticmethod
    def forget(task: TaskRecord) -> None:
        """The handler returned: its session is closed, and the parents'
        results are no longer read through it."""
        _fix(task, "_parents", None)

    def _parent_results(self, task: TaskRecord, session: Session) -> list[Any]:
        step = task.step_id
        if step is None:
            return []
        texts = self.adapter.workflow.parent_results(session.connection(), step_id=step)
        return [None if text is None else json.loads(text) for text in texts]

    @staticmethod
    def keep_result(task: TaskRecord, value: Any) -> None:
        """Keep ``value``, the handler's return, as the step's result when
        it has children to read it; raises StepResultError when it cannot
        be one (the attempt then fails)."""
        if task._children and value is not None:
            _fix(task, "_result", encode_result(value))

    def advance(self, conn: Connection, tasks: Iterable[TaskRecord]) -> None:
        """``tasks`` succeeded, in ``conn``'s transaction: write the results
        of those that are parents, and open their children's gates."""
        parents = [task for task in tasks if task._children]
        if not parents:
            return
        results = [(task.step_id, task._result) for task in parents if task._result is not None]
        self.adapter.workflow.results_write(conn, results=results)  # type: ignore[arg-type]
        self._open(conn, [task._children for task in parents])

    def _open(self, conn: Connection, gates: Sequence[Sequence[tuple[int, int]]]) -> None:
        """Parents are done: count down the gates they open (``gates``:
        each parent's (child, slot)), release the children whose own gate
        reaches 0 and finish the workflows whose end does. A parent's
        success opens its gates once (its chain succeeds once); a dead
        letter under ``continue`` marks its edges done as well, so that a
        requeue of that step opens nothing again."""
        queries = self.adapter.workflow
        opened = Counter(gate for each in gates for gate in each)
        barriers = {gate: n for gate, n in opened.items() if gate[1] != 0}
        own = Counter({gate: n for gate, n in opened.items() if gate[1] == 0})
        # barriers before own gates, each in key order: one lock order for all
        for owner, _ in self._count_down(conn, barriers):
            own[(owner, 0)] += 1
        reached = [owner for owner, _ in self._count_down(conn, own)]
        ready = sorted(owner for owner in reached if owner > 0)
        if ready and queries.release(conn, ids=ready) and self.adapter.supports_notify:
            self.adapter.notify(conn)  # at the commit: an UPDATE fires no insert trigger
        for end in sorted(owner for owner in reached if owner < 0):
            self._finish(conn, -end)

    def _count_down(
        self, conn: Connection, amounts: dict[tuple[int, int], int]
    ) -> list[tuple[int, int]]:
        """Take ``amounts`` off their gates; the gates that reach 0."""
        if not amounts:
            return []
        queries = self.adapter.workflow
        lefts = queries.gates_count_down(conn, amounts=amounts)
        reached = []
        for gate in sorted(amounts):
            if gate not in lefts:  # enqueued before the gates: never released early
                logger.error(
                    "workflow gate %s is missing: step %d is not released (a workflow "
                    "enqueued before its queue had gates? docs/workflows.md, Tables)",
                    gate,
                    gate[0],
                )
                continue
            left = lefts[gate]
            if left == 0:
                reached.append(gate)
            elif left < 0:  # a gate counted down past 0: never released twice
                logger.error("workflow gate %s counted down past 0 (%d)", gate, left)
        return reached

    def _finish(self, conn: Connection, workflow_id: int) -> None:
        """Every step of the workflow without children is done: its
        outcome, and its compensation steps are not needed."""
        queries = self.adapter.workflow
        outcome = "failed" if queries.dead_steps(conn, workflow_id=workflow_id) else "succeeded"
        if queries.finish(conn, workflow_id=workflow_id, outcome=outcome):
            compensations = queries.compensations_of(conn, workflow_id=workflow_id)
            queries.cancel_waiting(conn, ids=compensations, message=NOT_NEEDED_MESSAGE, mark=False)
            self._note(conn, workflow_id, outcome)

    @staticmethod
    def _note(conn: Connection, workflow_id: int, outcome: str) -> None:
        conn.info.setdefault(_FINISHED, []).append((workflow_id, outcome))

    def committed(self, conn: Connection | None, hooks: Hooks | None) -> None:
        """``conn``'s transaction committed: tell what it decided about
        whole workflows (logged; the hooks' ``workflow_finished``)."""
        finished = None if conn is None else conn.info.pop(_FINISHED, None)
        if not finished:
            return
        for workflow_id, outcome in finished:
            logger.info("workflow %d %s", workflow_id, outcome)
        if hooks is not None:
            table = self.adapter.table.name
            hooks.emit([WorkflowEvent(WORKFLOW_FINISHED, table, w, o) for w, o in finished])

    @staticmethod
    def rolled_back(conn: Connection | None) -> None:
        """``conn``'s transaction rolled back: what it decided did not happen.
        A lost connection is left alone: reading its ``info`` would
        reconnect it, and the entries went with the driver's connection."""
        if conn is None or conn.closed or conn.invalidated:
            return
        conn.info.pop(_FINISHED, None)

    def failed(self, conn: Connection, task: TaskRecord) -> None:
        """``task`` went to the dead letter, in ``conn``'s transaction:
        apply its workflow's policy, if it is a step."""
        step = task.step_id
        if step is None or not self.check(conn):
            return
        queries = self.adapter.workflow
        found = queries.step_of(conn, step_id=step)
        if found is None:
            return
        workflow_id, policy = found
        queries.steps_mark(conn, step_ids=[step], state=STEP_DEAD)
        if policy == "continue":
            edges = queries.children_of(conn, parents=[step])
            if edges:
                queries.edges_done(conn, parents=[step])
                self._open(conn, [[(child, slot) for _, child, slot in edges]])
            return
        below = descendants(step, queries.edges_of_workflow(conn, workflow_id=workflow_id))
        cancelled = queries.cancel_waiting(conn, ids=sorted(below), message=STOPPED_MESSAGE)
        if cancelled:
            logger.warning(
                "workflow %d: step %d went to the dead letter; %d waiting step(s) after it "
                "cancelled (policy %s)",
                workflow_id,
                step,
                len(cancelled),
                policy,
            )
        if queries.finish(conn, workflow_id=workflow_id, outcome="failed"):
            self._note(conn, workflow_id, "failed")
            if policy == "compensate":
                compensations = queries.compensations_of(conn, workflow_id=workflow_id)
                if queries.release(conn, ids=compensations) and self.adapter.supports_notify:
                    self.adapter.notify(conn)


def descendants(step: int, edges: Iterable[tuple[int, int]]) -> set[int]:
    """The steps reachable from ``step`` along (parent, child) ``edges``."""
    below: dict[int, list[int]] = {}
    for parent, child in edges:
        below.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = list(below.get(step, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found.add(child)
            todo += below.get(child, ())
    return found
