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
  parents' results are written, the children's task rows locked in id
  order, the parents' edges marked done, and each child whose edges are
  all done released. Every transaction that marks an edge of child X
  holds X's row lock while it does, so the one that finds no edge left
  has seen every other parent's commit: X is released once, after all its
  parents committed, in the last one's transaction.
- **At the dead letter** (:meth:`StepLinks.failed`), in the failure's
  transaction: the workflow's policy cancels the step's waiting
  descendants (``stop``) or releases its children as if it had succeeded,
  its result None (``continue``).

A database without the workflow tables (a queue made before them) is
found at the first claim, and none of this runs there.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..adapters import Adapter, ErrorKind
from ..common.exceptions import SqlaQueueError
from ..common.redaction import describe_error
from ..schema.mixins import RESULT_MAX_BYTES
from ..schema.records import TaskRecord
from ..schema.rows import CANCELLED_MESSAGE, STEP_MESSAGE

__all__ = ["StepLinks", "StepResultError"]

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
        children: dict[int, list[int]] = {}
        for parent, child in edges:
            children.setdefault(parent, []).append(child)
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
        if task._children:
            _fix(task, "_result", encode_result(value))

    def advance(self, conn: Connection, tasks: Iterable[TaskRecord]) -> None:
        """``tasks`` succeeded, in ``conn``'s transaction: write the results
        of those that are parents, and release their children that wait for
        nothing else."""
        parents = [task for task in tasks if task._children]
        if not parents:
            return
        steps = [(task.step_id, task._result) for task in parents]
        self.adapter.workflow.results_write(conn, results=steps)  # type: ignore[arg-type]
        self._release(
            conn,
            [step for step, _ in steps],  # type: ignore[misc]
            {child for task in parents for child in task._children},
        )

    def _release(self, conn: Connection, parents: Sequence[int], children: set[int]) -> None:
        queries = self.adapter.workflow
        queries.lock_tasks(conn, ids=sorted(children))  # before the edges: see the module
        queries.edges_done(conn, parents=parents)
        ready = sorted(children - queries.still_waiting(conn, children=sorted(children)))
        if ready and queries.release(conn, ids=ready) and self.adapter.supports_notify:
            self.adapter.notify(conn)  # at the commit: an UPDATE fires no insert trigger

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
        if policy == "continue":
            children = {child for _, child in queries.children_of(conn, parents=[step])}
            if children:
                self._release(conn, [step], children)
            return
        below = _descendants(step, queries.edges_of_workflow(conn, workflow_id=workflow_id))
        cancelled = queries.cancel_waiting(conn, ids=sorted(below), message=CANCELLED_MESSAGE)
        if cancelled:
            logger.warning(
                "workflow %d: step %d went to the dead letter; %d waiting step(s) after it "
                "cancelled (policy stop)",
                workflow_id,
                step,
                len(cancelled),
            )


def _descendants(step: int, edges: Iterable[tuple[int, int]]) -> set[int]:
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
